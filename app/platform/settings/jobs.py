"""The settings of running jobs: attempts, leases, backoff, the broker, retention,
webhooks and sync calls."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field

from app.platform.settings.service import ServiceSettings
from app.platform.settings.values import (
    Words,
    numbers,
    switch,
)


class JobSettings(ServiceSettings):
    """The settings of running jobs: attempts, leases, backoff, the broker, retention,"""

    job_max_attempts: int = Field(
        default=3, description="How many times a job may be claimed by a worker before it fails."
    )
    republish_after_seconds: float = Field(
        default=60.0,
        description="A queued job not picked up for this long may have lost its wake-up with "
        "the broker; the sweep wakes its model's workers again.",
    )
    job_lease_seconds: float = Field(
        default=60.0,
        description="A running job's lease; the worker renews it while the job runs, and a "
        "job whose lease ran out (its worker died) is queued again by the sweep.",
    )
    sweep_interval_seconds: float = Field(
        default=5.0, description="How often beat runs the sweeps (leases, retries, deadlines)."
    )
    control_lease_seconds: float = Field(
        default=4.0,
        gt=0,
        description="The control lease: of the beats running (one per control host), the one "
        "holding it sends the sweeps and renews it every second; a standby takes over once it "
        "has not been renewed for this long. Below SWEEP_INTERVAL_SECONDS, so a lost control "
        "host costs at most one sweep.",
    )
    retry_backoff_seconds: float = Field(
        default=2.0,
        description="Backoff before the first retry of a job that failed for a transient "
        "reason, doubled for each attempt after; each wait is drawn between 0 and it "
        "(exponential backoff with full jitter).",
    )
    retry_backoff_max_seconds: float = Field(
        default=300.0, description="The cap on RETRY_BACKOFF_SECONDS' doubling."
    )
    job_time_limit_seconds: float = Field(
        default=600.0,
        description="The longest a job may run; the worker process running it is then killed "
        "and the job's lease brings it back (and its cap ends it).",
    )
    broker_visibility_timeout_seconds: float = Field(
        default=3600.0,
        description="Redis hands an unacknowledged message to another worker after this "
        "long; keep it above JOB_TIME_LIMIT_SECONDS (a warning says so if not; leases still "
        "keep a second worker from running the job).",
    )
    broker_restore_interval_seconds: float = Field(
        default=10.0,
        description="How often workers put back messages whose visibility timeout passed "
        "(kombu's default scan is about every 100 s).",
    )
    retention_seconds: float = Field(
        default=7 * 24 * 3600.0,
        description="Inputs and outputs of finished jobs are deleted after this long (the "
        "job's metadata stays). 0 keeps them forever.",
    )
    purge_interval_seconds: float = Field(
        default=3600.0,
        gt=0,
        description="How often beat runs the purge (retention below). Each run deletes at most "
        "a million rows of each kind, so at 3600 it keeps up with about 270 finished jobs a "
        "second; above that, run it more often (60: 16,000 a second).",
    )
    job_retention_seconds: float = Field(
        default=30 * 24 * 3600.0,
        description="How long the hourly purge keeps a finished job's row, with its events, "
        "webhook deliveries and idempotency key (a batch's chunks go with their batch, this "
        "long after it finished), so the tables stay flat; a job or batch with a dead letter "
        "is kept while the letter is. 0 keeps them forever.",
    )
    job_event_retention_seconds: float = Field(
        default=30 * 24 * 3600.0,
        description="How long the hourly purge keeps job events (event streams, the job's "
        "history); 0 keeps them forever.",
    )
    webhook_payload_retention_seconds: float = Field(
        default=7 * 24 * 3600.0,
        description="How long the hourly purge keeps the body a finished delivery sent (it "
        "holds the job's outputs: the same default as RETENTION_SECONDS); 0 keeps it forever.",
    )
    webhook_log_retention_seconds: float = Field(
        default=30 * 24 * 3600.0,
        description="How long the hourly purge keeps finished deliveries and their attempts "
        "(a failed delivery stays while its dead letter does); 0 keeps them forever.",
    )
    dead_letter_retention_seconds: float = Field(
        default=90 * 24 * 3600.0,
        description="How long the hourly purge keeps dead letters, replayed or not; 0 keeps "
        "them forever.",
    )
    audit_retention_seconds: float = Field(
        default=365 * 24 * 3600.0,
        description="How long the hourly purge keeps audit rows (replays, purges); 0 keeps "
        "them forever.",
    )
    control_queue: str = Field(
        default="control",
        description="The Celery queue of beat's sweeps (leases, deadlines, due webhooks, "
        "schedules, purges), served by the control worker, so a backlog of jobs never delays "
        "them.",
    )
    webhooks_queue: str = Field(
        default="webhooks",
        description="The Celery queue of webhook deliveries, so slow receivers never hold "
        "inference workers.",
    )
    webhook_timeout_seconds: float = Field(
        default=15.0,
        description="The whole budget of one attempt (connect, send, answer, reading at most "
        "4 KiB of the body), wall clock: a receiver that trickles is cut off.",
    )
    webhook_retry_schedule: Annotated[tuple[float, ...], BeforeValidator(numbers)] = Field(
        default=(0, 5, 300, 1800, 7200, 18000, 36000, 50400, 72000, 86400),
        description="Seconds before each attempt (comma list); its length is the number of "
        "attempts. Jittered by up to 10%. Default: over about a day.",
    )
    webhook_disable_after_seconds: float = Field(
        default=5 * 24 * 3600.0,
        description="A tenant's webhook URL whose deliveries have all failed for this long "
        "(from its first failure, no success since) is disabled: its pending deliveries stop "
        "and new ones are not sent, each kept as `disabled` in the log. Redelivering one of "
        "them re-enables the URL. Judged at each failed attempt. 0 never disables.",
    )
    webhook_allow_private_networks: Annotated[bool, BeforeValidator(switch)] = Field(
        default=False,
        description="Allow webhook URLs on loopback and private ranges (development and "
        "tests) when 1, true or yes; any other value is off. Off by default: those are where "
        "SSRF does harm.",
    )
    webhook_allowed_networks: Annotated[tuple[str, ...], Words] = Field(
        default=(),
        description="Comma list of CIDRs that count as public for webhook URLs (a known "
        'internal receiver; tests use a loopback address as the "public" one).',
    )
    webhook_proxy_url: str = Field(
        default="",
        description="Send every delivery through this http:// egress proxy, which then "
        "resolves and enforces the egress policy. Unset: connect to the checked address. "
        "Proxy variables of the environment (HTTP_PROXY, .netrc) are never used.",
    )
    webhook_max_payload_bytes: int = Field(
        default=256 * 1024,
        description="A larger job is sent with its outputs replaced by a link.",
    )
    sync_timeout_seconds: float = Field(
        default=30.0,
        description="How long a sync inference call waits for its job before it answers 504 "
        "with the job's id (the job goes on); a request may ask for less.",
    )
    max_wait_seconds: float = Field(
        default=60.0, description="The cap on `Prefer: wait=N` and on a sync call's own timeout."
    )
    sync_lane: Annotated[bool, BeforeValidator(switch)] = Field(
        default=True,
        description="Sync calls of worker-run models travel the sync lane (Redis, straight to "
        "a worker's micro-batch; the record written behind) when 1, true or yes; otherwise "
        "each is a job row first, like an async job ahead of the queue.",
    )
    sync_lane_max_waiting: int = Field(
        default=1024,
        description="Sync calls of one model waiting on the lane for a worker; beyond it a "
        "call is refused at once (429 queue-full, Retry-After), never left to hang.",
    )
    sync_lane_lease_seconds: float = Field(
        default=3.0,
        description="A worker's lane threads renew their liveness key every third of this; "
        "once it lapses, the calls it had taken are run once more elsewhere (an idempotent "
        "model's) or answered 503.",
    )
