"""Bearer-key authentication: tenant keys for the job routes, operator keys for
the model repository routes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from flask import g, request
from flask_smorest import Blueprint

from app.errors import Forbidden
from app.observability import logs
from app.operations import OPERATOR, Caller, TenantRef
from app.operations.models import PUBLIC
from app.web.context import requests_in_progress, services
from app.web.problems import Problem

F = TypeVar("F", bound=Callable[..., Any])

SECURITY_SCHEME = {"type": "http", "scheme": "bearer", "description": "API key"}

# Only lends its documentation decorators to `authenticated`; never registered.
_docs = Blueprint("auth", __name__)


def current_tenant() -> TenantRef:
    tenant: TenantRef = g.tenant
    return tenant


def current_actor() -> str:
    """Who made this request, for the audit log: tenant and key prefix."""
    actor: str = g.actor
    return actor


def _caller() -> Caller:
    """The caller named by `Authorization: Bearer <key>`; 401 without a valid key."""
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Problem(
            "unauthorized",
            "send the header `Authorization: Bearer <api key>`",
            headers={"WWW-Authenticate": "Bearer"},
        )
    caller = services().tenants.authenticate(key.strip())
    if caller is None:
        raise Problem(
            "unauthorized",
            "the API key is not valid, was revoked or has expired",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
    who = caller.tenant.name if caller.tenant else caller.kind
    g.actor = f"{who} (key {key.strip()[:10]}...)"
    return caller


def optional_tenant() -> str | None:
    """For routes open without a key (model metadata): the tenant's name, or
    `PUBLIC` (only models open to every tenant) without a key; a key that is
    sent must be valid."""
    if "Authorization" not in request.headers:
        return PUBLIC
    caller = _caller()
    return caller.tenant.name if caller.tenant else None  # an operator sees every model


def optional_operator() -> bool:
    """For pages open without a key that show operators more (the status page):
    False without an `Authorization` header, True for an operator's key; a bad
    key is refused (401), a tenant's too (403): it never unlocks the operator view."""
    if "Authorization" not in request.headers:
        return False
    if _caller().kind != OPERATOR:
        raise Forbidden("a tenant's key does not open the operator view; send an operator key")
    return True


_STREAMS_BODY = "_streams_body"


def streams_body(view: F) -> F:
    """Mark a view that reads its body as it runs (an upload, under its own size
    limit), put below `authenticated`: nothing is read ahead of it."""
    setattr(view, _STREAMS_BODY, True)
    return view


def authenticated(view: F) -> F:
    """Require a tenant's key, expose the tenant as `current_tenant()`. An
    operator key is refused (403): it belongs to no tenant.

    The body is then read here, counted among the tenant's requests in progress
    (MAX_REQUESTS_PER_TENANT) until it has arrived, so one tenant's slow bodies
    cannot take every request thread of the process, while a burst of its quick
    requests is never refused (a body already sent is read at once). A view that
    reads its own body as it runs (`streams_body`: an upload) is counted until
    it returns."""

    @functools.wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        caller = _caller()
        if caller.tenant is None:
            raise Forbidden("this route needs a tenant's API key; an operator key has no jobs")
        g.tenant = caller.tenant
        logs.bind(tenant=caller.tenant.name)  # on every line of this request from here on
        with requests_in_progress().holding(caller.tenant.id):
            if getattr(view, _STREAMS_BODY, False):
                return view(*args, **kwargs)
            request.get_data(cache=True)  # what the view parses later
        return view(*args, **kwargs)

    documented = _docs.doc(security=[{"bearerAuth": []}])(wrapper)
    with_401: F = _docs.alt_response(401, response="UNAUTHORIZED")(documented)
    with_403: F = _docs.alt_response(403, response="FORBIDDEN")(with_401)
    if 429 in getattr(view, "_apidoc", {}).get("response", {}).get("responses", {}):
        return with_403  # its own 429 says more (a full queue, a quota)
    return _docs.alt_response(
        429, response="TOO_MANY_REQUESTS", description="Too many requests in progress"
    )(with_403)


def operator_only(view: F) -> F:
    """Require an operator's key (`manage.py create-api-key --operator`); a
    tenant's key is refused (403)."""

    @functools.wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _caller().kind != OPERATOR:
            raise Forbidden("this route needs an operator key (create-api-key --operator)")
        return view(*args, **kwargs)

    documented = _docs.doc(security=[{"bearerAuth": []}])(wrapper)
    with_401: F = _docs.alt_response(401, response="UNAUTHORIZED")(documented)
    with_403: F = _docs.alt_response(403, response="FORBIDDEN")(with_401)
    return with_403
