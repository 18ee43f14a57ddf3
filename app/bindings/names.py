"""The stream door's log names: `<STREAMS_PREFIX>:<tenant>:<name>`.

A tenant's logs all start with its own prefix, so one Redis ACL rule
(`~streams:acme:*`) lets its producers and readers reach them and nothing else.
That holds only if no tenant's prefix is a prefix of another's and no glob
character reaches the pattern: a tenant name may hold any character, so its
segment is percent-encoded (letters, digits and `._-~` stay as they are; `:`,
`*`, `?`, `[`, `]`, `\\`, `%` and the rest become `%XX`). The segment then never
holds a `:`, and `streams:acme:*` cannot match the logs of a tenant `acme:x`
(whose segment is `acme%3Ax`). Log names themselves are `[A-Za-z0-9._-]`.
"""

from __future__ import annotations

import re
from urllib.parse import quote

from app.errors import InvalidRequest

NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")
# The dead-letter log of an input log `x` is `x.dead`: no binding may name one.
DEAD_SUFFIX = ".dead"
MAX_FULL_NAME = 300  # the columns' width


def tenant_segment(tenant: str) -> str:
    """The tenant's part of its log names: its name, percent-encoded."""
    return quote(tenant, safe="")


def tenant_prefix(prefix: str, tenant: str) -> str:
    """What every log of `tenant` starts with, `:` included (`streams:acme:`)."""
    return f"{prefix}:{tenant_segment(tenant)}:"


def full_name(prefix: str, tenant: str, given: str, field: str) -> str:
    """The full log name for `given`: a short name, or a full name already under
    the tenant's own prefix (what GET answers, so it can be sent back). Anything
    else, another tenant's log included, is InvalidRequest naming `field`."""
    own = tenant_prefix(prefix, tenant)
    name = given[len(own) :] if given.startswith(own) else given
    if not NAME.fullmatch(name):
        if ":" in given:
            raise InvalidRequest(
                f"{field} {given!r} is not a log of yours: send a short name such as "
                f"'requests', or a full name that starts with your prefix {own!r}",
                errors={field: [f"a name of [A-Za-z0-9._-], or {own}<name>"]},
            )
        raise InvalidRequest(
            f"{field} {given!r} is not a log name: use 1 to 100 letters, digits, '.', '_' or '-'",
            errors={field: ["1 to 100 of [A-Za-z0-9._-]"]},
        )
    if name.endswith(DEAD_SUFFIX):
        raise InvalidRequest(
            f"{field} {given!r} ends in {DEAD_SUFFIX!r}, which names dead-letter logs; "
            "choose another name",
            errors={field: [f"not ending in {DEAD_SUFFIX}"]},
        )
    full = own + name
    if len(full) > MAX_FULL_NAME:
        raise InvalidRequest(
            f"{field}: the full log name {full!r} is longer than {MAX_FULL_NAME} characters; "
            "choose a shorter name",
            errors={field: [f"at most {MAX_FULL_NAME} characters with the prefix"]},
        )
    return full


def dead_letter_of(input_log: str) -> str:
    """The dead-letter log of an input log."""
    return input_log + DEAD_SUFFIX
