"""What callers of the services can get wrong, as plain exceptions.

Services (submit, cancel, replay, ...) raise these without knowing about HTTP,
so beat schedules, the CLI and batch code can call them too; `app.web.problems` maps
each kind to its problem+json type once, at the HTTP edge. Errors of other
layers are mapped there as well: `UnknownModel` (the model repository).
"""

from __future__ import annotations

from typing import Any, ClassVar


class DomainError(Exception):
    """`detail` says what was wrong for a person; `extra` adds machine-readable
    members (`errors`, `expected`, ...); `retry_after` invites a retry. `status`
    overrides the problem type's own where one type spans several (a failed
    inference: the inputs' fault or the service's); `headers` point elsewhere
    (`Location` of a job that goes on)."""

    problem_type: ClassVar[str] = "validation-error"

    def __init__(
        self,
        detail: str,
        *,
        retry_after: int | None = None,
        status: int | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.detail, self.retry_after, self.extra = detail, retry_after, extra
        self.status, self.headers = status, headers or {}


class InvalidRequest(DomainError):
    """A field has a value the service cannot accept (422)."""


class InputsDoNotFit(DomainError):
    """The inputs do not match the model's card (422 invalid-input)."""

    problem_type = "invalid-input"


class NotFound(DomainError):
    """No such thing for this tenant: another tenant's looks the same (404)."""

    problem_type = "not-found"


class Conflict(DomainError):
    """The thing is not in a state that allows this (409)."""

    problem_type = "conflict"


class TooLarge(DomainError):
    """More bytes than a limit allows (413)."""

    problem_type = "payload-too-large"


class InvalidModel(DomainError):
    """A model file or its definition cannot serve: not ONNX, not loadable by ONNX
    Runtime, of unsupported types, or not matching its card (422 invalid-model)."""

    problem_type = "invalid-model"


class Forbidden(DomainError):
    """The key is valid but of the wrong kind for this route (403)."""

    problem_type = "forbidden"
