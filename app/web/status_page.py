"""The status page at `/` (HTML, for people) and `/status.json` (for scripts).

Anyone sees aggregate numbers. Operators see more (the newest dead letters with
job ids, tenants and error codes; the workers by name), either with
`Authorization: Bearer <operator key>` or, in a browser, which cannot send that
header, by posting the key once to a form: the session cookie then holds the
key's hash (never the key), signed with SECRET_KEY, HttpOnly, SameSite=Strict,
and is checked against the key's row on every load, so a revoked key signs its
sessions out within API_KEY_CACHE_SECONDS. A tenant's key never opens the
operator view. Operator responses are `Cache-Control: no-store`.
"""

from __future__ import annotations

import logging
import secrets
from datetime import timedelta
from urllib.parse import urlsplit

from flask import (
    Blueprint as FlaskBlueprint,
)
from flask import (
    Flask,
    flash,
    get_flashed_messages,
    jsonify,
    make_response,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from flask.sessions import SecureCookieSession, SecureCookieSessionInterface
from flask.wrappers import Request
from werkzeug.wrappers import Response

from app.errors import Forbidden
from app.operations import OPERATOR
from app.operations.status import Status, StatusSchema, status_dict
from app.operations.tenants import hash_key
from app.platform.kept_secrets import kept_secret
from app.platform.settings import Settings
from app.web.auth import optional_operator
from app.web.blueprint import Blueprint
from app.web.context import services

logger = logging.getLogger(__name__)

blp = Blueprint("status", __name__, description="Service status")
pages = FlaskBlueprint("status_pages", __name__)

SESSION_KEY = "operator_key_sha256"
SESSION_PATHS = ("/status",)  # and "/": the pages that read or write the session
SESSION_HOURS = 12
MAX_KEY_CHARS = 200


class _SessionInterface(SecureCookieSessionInterface):
    """Flask's signed cookie, marked Secure when the request came over HTTPS
    (directly, or through the TLS proxy, which says so in X-Forwarded-Proto: a
    forged header can only make the cookie stricter)."""

    def open_session(self, app: Flask, incoming: Request) -> SecureCookieSession | None:
        """Only the status pages have a session: any other route (the API, on every
        call) skips reading and signing the cookie. None: Flask's null session."""
        if incoming.path != "/" and not incoming.path.startswith(SESSION_PATHS):
            return None
        return super().open_session(app, incoming)

    def get_cookie_secure(self, app: Flask) -> bool:
        forwarded = request.headers.get("X-Forwarded-Proto", "").lower() == "https"
        return request.is_secure or forwarded


def init_sessions(app: Flask, settings: Settings) -> None:
    """The operator session: its signing key and cookie flags."""
    app.secret_key = settings.secret_key or _kept_secret_key(settings)
    app.session_interface = _SessionInterface()
    app.config.update(
        SESSION_COOKIE_NAME="status_session",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
        PERMANENT_SESSION_LIFETIME=timedelta(hours=SESSION_HOURS),  # the signature's max age
    )


def _kept_secret_key(settings: Settings) -> str:
    try:
        return kept_secret(settings.var_dir / "secret-key")
    except OSError as exc:
        logger.warning(
            "cannot keep a secret key in %s (%s): this process signs status page sessions "
            "with a key of its own, which other API processes refuse; set SECRET_KEY",
            settings.var_dir,
            exc.strerror,
        )
        return secrets.token_urlsafe(32)


def _is_operator() -> bool:
    """By the Authorization header when one is sent, else by the session cookie."""
    if optional_operator():
        return True
    digest = session.get(SESSION_KEY)
    if not isinstance(digest, str):
        return False
    caller = services().tenants.authenticate_hash(digest)
    if caller is None or caller.kind != OPERATOR:
        session.pop(SESSION_KEY, None)  # revoked or expired since: signed out
        return False
    return True


def _status() -> Status:
    return services().status.status(operator=_is_operator())


def _links() -> dict[str, str | None]:
    settings: Settings = services().settings
    return {"docs": "/docs", "openapi": "/openapi.json", "flower": settings.flower_url or None}


def _private(response: Response, status: Status) -> Response:
    """Operator data is never stored by a cache; the public view varies by who asks."""
    response.headers["Cache-Control"] = "no-store" if status.operator else "no-cache"
    response.vary.update(("Cookie", "Authorization"))
    return response


@blp.get("/status.json")
@blp.doc(security=[{}, {"bearerAuth": []}])
@blp.response(200, StatusSchema)
@blp.alt_response(401, response="UNAUTHORIZED", description="A key was sent and is not valid")
@blp.alt_response(403, response="FORBIDDEN", description="A tenant's key was sent")
def status_json() -> Response:
    """The status page's numbers; with an operator's key, also its operator view."""
    status = _status()
    body = StatusSchema().dump(status_dict(status, _links()))
    return _private(jsonify(body), status)


@pages.get("/")
def page() -> Response:
    status = _status()
    html = render_template(
        "status.html", status=status, links=_links(), messages=get_flashed_messages()
    )
    response = _private(make_response(html), status)
    # No script runs on the page; it may not be framed (its forms are buttons).
    response.headers["Content-Security-Policy"] = (
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    )
    response.headers["X-Frame-Options"] = "DENY"
    # Not no-referrer: browsers then send `Origin: null` with the page's own form
    # posts, which _same_origin must refuse.
    response.headers["Referrer-Policy"] = "same-origin"
    return response


@pages.post("/status/sign-in")
def sign_in() -> Response:
    """Post an operator key; a 303 back to the page either way (a message says why not)."""
    _same_origin()
    key = request.form.get("key", "").strip()
    caller = services().tenants.authenticate(key) if 0 < len(key) <= MAX_KEY_CHARS else None
    if caller is None:
        flash("That key is not valid, was revoked or has expired.")
    elif caller.kind != OPERATOR:
        flash(
            "That is a tenant's key. The operator view needs an operator key: "
            "python manage.py create-api-key --operator"
        )
    else:
        session.clear()
        session[SESSION_KEY] = hash_key(key)
    return _back()


@pages.post("/status/sign-out")
def sign_out() -> Response:
    _same_origin()
    session.clear()
    return _back()


def _back() -> Response:
    response = redirect(url_for("status_pages.page"), 303)
    response.headers["Cache-Control"] = "no-store"
    return response


def _same_origin() -> None:
    """Only the page itself may sign in or out (no cross-site form posts): the
    browser's Origin and Sec-Fetch-Site headers say where a post came from."""
    site = request.headers.get("Sec-Fetch-Site")
    origin = request.headers.get("Origin")
    if site not in (None, "same-origin", "none") or (
        origin is not None and urlsplit(origin).netloc != request.host
    ):
        raise Forbidden("sign in and out from the status page itself")


@pages.app_template_filter("duration")
def duration(seconds: float | None) -> str:
    """A short human duration: "42 s", "3 min 5 s", "2 h 10 min", "3 d 4 h"."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60),
                                      ("min", 60, "s", 1)):  # fmt: skip
        if s >= size:
            rest = (s % size) // sub_size
            return f"{s // size} {unit}" + (f" {rest} {sub}" if rest else "")
    return f"{s} s"
