"""The one mapping of the operations' errors to gRPC status codes.

Each `DomainError` code maps to a status; its `detail` (what was wrong, what
was expected) becomes the status details, and what a program needs travels as
trailing metadata: `error-code` (the problem type's name, as in the HTTP
door's `/problems/<code>`), `retry-after` (seconds, where a retry helps),
`job-id` (the job a failed or unfinished call made: GET /jobs/<id>) and
`job-error-code` (why that job failed). Anything else is INTERNAL with a
reference to the logged error, never its internals.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

import grpc

from app.errors import DomainError, InferenceFailed, TenantGone

logger = logging.getLogger(__name__)

Code = grpc.StatusCode

CODES: dict[str, Code] = {
    "validation-error": Code.INVALID_ARGUMENT,
    "malformed-request": Code.INVALID_ARGUMENT,
    "invalid-input": Code.INVALID_ARGUMENT,
    "invalid-parameter": Code.INVALID_ARGUMENT,
    "not-found": Code.NOT_FOUND,
    "unknown-model": Code.NOT_FOUND,
    "conflict": Code.FAILED_PRECONDITION,
    "payload-too-large": Code.RESOURCE_EXHAUSTED,
    "invalid-model": Code.INVALID_ARGUMENT,  # as Triton answers a load that failed
    "forbidden": Code.PERMISSION_DENIED,
    "service-unavailable": Code.UNAVAILABLE,
    "insufficient-storage": Code.RESOURCE_EXHAUSTED,
    "queue-full": Code.RESOURCE_EXHAUSTED,
    "quota-exceeded": Code.RESOURCE_EXHAUSTED,
    "too-many-waits": Code.RESOURCE_EXHAUSTED,
    "too-many-requests": Code.RESOURCE_EXHAUSTED,
    "sync-timeout": Code.DEADLINE_EXCEEDED,
    "caller-left": Code.CANCELLED,
}
# An InferenceFailed by whose fault it is (see app.errors.InferenceFailed.fault).
_FAULT_CODES = {"input": Code.INVALID_ARGUMENT, "service": Code.INTERNAL}
_LIMIT_CODES = {"cancelled": Code.CANCELLED}  # else DEADLINE_EXCEEDED (expired, deadline)


@dataclass(frozen=True)
class Status:
    code: Code
    details: str
    metadata: tuple[tuple[str, str], ...] = ()

    def message(self) -> str:
        """One line for a stream's `error_message`: the code's name, then the details."""
        return f"{self.code.name}: {self.details}"


def of(error: DomainError) -> Status:
    metadata = [("error-code", error.code)]
    if error.retry_after is not None:
        metadata.append(("retry-after", str(error.retry_after)))
    job_id = error.extra.get("job_id")
    if job_id:
        metadata.append(("job-id", str(job_id)))
    details = error.detail
    if isinstance(error, InferenceFailed):
        job_error = str(error.extra.get("error_code", ""))
        metadata.append(("job-error-code", job_error))
        if error.fault == "limits":
            code = _LIMIT_CODES.get(job_error, Code.DEADLINE_EXCEEDED)
        else:
            code = _FAULT_CODES[error.fault]
        if error.fault == "service":  # the service's own failure: no internals
            details = f"the service could not run this request ({job_error})" + (
                f"; job {job_id}" if job_id else ""
            )
    elif isinstance(error, TenantGone):  # not worth a retry, unlike other quotas
        code = Code.PERMISSION_DENIED
    else:
        code = CODES.get(error.code, Code.INVALID_ARGUMENT)
    return Status(code, details, tuple(metadata))


def unexpected(exc: BaseException) -> Status:
    """INTERNAL, with a reference a person can find in the logs."""
    reference = uuid.uuid4().hex[:12]
    logger.error("unexpected error (reference %s)", reference, exc_info=exc)
    return Status(Code.INTERNAL, f"internal error (reference {reference}); it was logged")
