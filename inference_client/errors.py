"""The client's exceptions. Every answer outside 2xx becomes one `ApiError`,
carrying the RFC 9457 problem the service sent (OpenAI's error object at /v1),
so callers branch on `status` / `type` instead of parsing text."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import requests

    from inference_client.resources import Batch, Job


class ApiError(Exception):
    """A non-2xx answer. `problem` holds every member of the problem+json body
    (extensions such as `errors`, `expected`, `job_id` included), or of OpenAI's
    error object at /v1 (`message`, `type`, `param`, `code`); `body` is the body
    as received, for answers that were neither (a proxy's page)."""

    def __init__(
        self,
        status: int,
        *,
        type: str = "about:blank",
        title: str = "",
        detail: str = "",
        instance: str | None = None,
        problem: dict[str, Any] | None = None,
        body: str = "",
        retry_after: float | None = None,
        method: str = "",
        url: str = "",
    ) -> None:
        self.status = status
        self.type = type
        self.title = title
        self.detail = detail
        self.instance = instance
        self.problem: dict[str, Any] = problem or {}
        self.body = body
        self.retry_after = retry_after
        self.method = method
        self.url = url
        super().__init__(f"{status} {title}: {detail}" if detail else f"{status} {title}")

    @property
    def errors(self) -> Any:
        """The problem's `errors` member (field or input name -> what was wrong), if any."""
        return self.problem.get("errors")

    @classmethod
    def from_problem(cls, problem: dict[str, Any], *, method: str = "", url: str = "") -> ApiError:
        """A problem object inside a 2xx body (a bulk's refused item)."""
        retry = problem.get("retry_after")
        return cls(
            int(problem.get("status") or 0),
            type=str(problem.get("type") or "about:blank"),
            title=str(problem.get("title") or ""),
            detail=str(problem.get("detail") or ""),
            instance=problem.get("instance"),
            problem=problem,
            retry_after=float(retry) if isinstance(retry, int | float) else None,
            method=method,
            url=url,
        )

    @classmethod
    def from_response(cls, response: requests.Response) -> ApiError:
        """The answer's problem+json; at /v1, OpenAI's error object
        `{"error": {"message", "type", "param", "code"}}` instead: then `problem`
        holds that object, `type` its type (`invalid_request_error`, ...), `title`
        the status's reason and `detail` its message."""
        text = response.text
        problem: dict[str, Any] = {}
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            problem = parsed
        status = response.status_code
        title = problem.get("title")
        detail = problem.get("detail")
        openai = problem.get("error")
        if isinstance(openai, dict) and title is None and detail is None:
            problem, detail = dict(openai), openai.get("message")
        return cls(
            status,
            type=str(problem.get("type") or "about:blank"),
            title=str(title) if title is not None else (response.reason or ""),
            detail=str(detail) if detail is not None else text[:500],
            instance=problem.get("instance"),
            problem=problem,
            body=text,
            retry_after=parse_retry_after(response.headers.get("Retry-After")),
            method=(response.request.method or "") if response.request is not None else "",
            url=response.url,
        )


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header: delta-seconds or an HTTP date (RFC 9110);
    None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


class WaitTimeout(TimeoutError):
    """Waiting ran out of time before the job (or batch) finished. `last` is
    what was last read of it (a Job or Batch), None if nothing could be read."""

    def __init__(self, message: str, last: Job | Batch | None = None) -> None:
        super().__init__(message)
        self.last: Job | Batch | None = last


class JobFailed(Exception):
    """A job whose outputs a call needs ended without them (failed, cancelled or
    expired). `job` is the finished job; its `error` says why."""

    def __init__(self, job: Job) -> None:
        why = f": {job.error.code}" if job.error is not None else ""
        if job.error is not None and job.error.message:
            why += f" ({job.error.message})"
        super().__init__(f"job {job.id} ended {job.status}{why}")
        self.job = job


class WebhookVerificationError(Exception):
    """The webhook's signature, headers or timestamp do not verify: drop it."""
