"""Bearer-key authentication for the job routes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from flask import current_app, g, request
from flask_smorest import Blueprint

from app.db.session import current_session
from app.errors import Problem
from app.tenants import KeyCache, TenantRef

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


def authenticated(view: F) -> F:
    """Require `Authorization: Bearer <key>`, expose the tenant as `current_tenant()`."""

    @functools.wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        scheme, _, key = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Problem(
                "unauthorized",
                "send the header `Authorization: Bearer <api key>`",
                headers={"WWW-Authenticate": "Bearer"},
            )
        keys: KeyCache = current_app.extensions["api_keys"]
        tenant = keys.lookup(current_session(), key.strip())
        if tenant is None:
            raise Problem(
                "unauthorized",
                "the API key is not valid or was revoked",
                headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
            )
        g.tenant = tenant
        g.actor = f"{tenant.name} (key {key.strip()[:10]}...)"
        return view(*args, **kwargs)

    documented = _docs.doc(security=[{"bearerAuth": []}])(wrapper)
    with_401: F = _docs.alt_response(401, response="UNAUTHORIZED")(documented)
    return with_401
