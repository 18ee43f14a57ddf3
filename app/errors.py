"""What can go wrong for a caller of the operations, as plain exceptions.

Each error says what went wrong, and nothing about a protocol: a `code` (a
short stable name such as `queue-full`), a `detail` for a person, machine-
readable `extra` members (`errors`, `expected`, `limit`, `job_id`, ...) and,
where a retry helps, `retry_after` seconds. Every door maps them once, at its
edge: the HTTP door to problem+json statuses and headers (`app.web.problems`),
the gRPC door to status codes; beat, the CLI and batch code just let them rise.
"""

from __future__ import annotations

from typing import Any, ClassVar


class DomainError(Exception):
    """`detail` says what was wrong for a person; `extra` adds machine-readable
    members; `retry_after` (seconds) invites a retry."""

    code: ClassVar[str] = "validation-error"

    def __init__(self, detail: str, *, retry_after: int | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.detail, self.retry_after, self.extra = detail, retry_after, extra


class InvalidRequest(DomainError):
    """A field has a value the service cannot accept."""


class MalformedRequest(DomainError):
    """The request cannot be read at all (a header that is not what it must be)."""

    code = "malformed-request"


class InvalidParameter(DomainError):
    """A request's parameter the service cannot honour (a model repository load's
    `config` field it cannot express, a parameter it does not take); `parameter`
    names it."""

    code = "invalid-parameter"


class InputsDoNotFit(DomainError):
    """The inputs do not match the model's card."""

    code = "invalid-input"


class NotFound(DomainError):
    """No such thing for this tenant: another tenant's looks the same."""

    code = "not-found"


TRITON_UNKNOWN = "Request for unknown model"


class UnknownModel(DomainError, LookupError):
    """Not served to this caller: absent, not visible to its tenant, or a version
    that is not serving (`why` says which, when the model itself exists)."""

    code = "unknown-model"

    def __init__(
        self, name: str, version: str | None, known: list[str], why: str | None = None
    ) -> None:
        self.name, self.version, self.known = name, version, known
        what = f"model '{name}'" + (f" version '{version}'" if version else "")
        listed = ", ".join(known) or "none"
        # Triton's own wording leads: its example clients look for it.
        if why:
            detail = f"{TRITON_UNKNOWN}: {what} is not serving ({why}); serving: {listed}"
        else:
            detail = f"{TRITON_UNKNOWN}: {what} is not in the repository; known models: {listed}"
        super().__init__(detail, known_models=known)


class Conflict(DomainError):
    """The thing is not in a state that allows this."""

    code = "conflict"


class TooLarge(DomainError):
    """More bytes than a limit allows."""

    code = "payload-too-large"


class InvalidModel(DomainError):
    """A model file or its definition cannot serve: not ONNX, not loadable by ONNX
    Runtime, of unsupported types, or not matching its card."""

    code = "invalid-model"


class Forbidden(DomainError):
    """The key is valid but of the wrong kind for this operation."""

    code = "forbidden"


class Unavailable(DomainError):
    """Something the operation needs is not there right now (a model's file, the
    database, the broker); worth a retry after `retry_after` seconds."""

    code = "service-unavailable"


class InsufficientStorage(DomainError):
    """The file store has no room for what was sent (its disk or quota is full);
    nothing of it was kept. Worth a retry once space is freed."""

    code = "insufficient-storage"


class QueueFull(DomainError):
    """The model's queue is at its bound; nothing of the request was kept."""

    code = "queue-full"


class QuotaExceeded(DomainError):
    """A quota of the tenant is used up; `limit` names it. Nothing was kept."""

    code = "quota-exceeded"


class TenantGone(QuotaExceeded):
    """The tenant of a still-cached key was deleted: nothing is admitted for it."""


class TooManyWaits(DomainError):
    """This tenant, or this process, already holds its share of waiting requests."""

    code = "too-many-waits"


class TooManyRequests(DomainError):
    """This tenant already has its share of requests in progress on this process."""

    code = "too-many-requests"


class DeadlinePassed(DomainError):
    """A sync call's job did not finish in time; it goes on, and `job_id` names it."""

    code = "sync-timeout"


class CallerLeft(DomainError):
    """The caller of a sync call went away (a cancelled gRPC call) before its job
    finished; the job was cancelled. Nobody is left to tell: doors just stop."""

    code = "caller-left"


class InferenceFailed(DomainError):
    """The job ended without outputs; `error_code` says why and `fault` whose it
    is: `input` (the request's own), `limits` (its cancel or deadline) or
    `service`."""

    code = "inference-failed"

    # Failures the request's own inputs caused, and those of the job's own limits.
    INPUT_FAULTS: ClassVar[frozenset[str]] = frozenset(
        {"invalid_input", "inference_error", "non_finite_output", "code_error", "code_time_limit"}
    )
    LIMIT_FAULTS: ClassVar[frozenset[str]] = frozenset(
        {"cancelled", "expired", "deadline_exceeded"}
    )

    @property
    def fault(self) -> str:
        error_code = self.extra.get("error_code")
        if error_code in self.INPUT_FAULTS:
            return "input"
        return "limits" if error_code in self.LIMIT_FAULTS else "service"
