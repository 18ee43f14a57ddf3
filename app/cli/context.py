"""What a command reaches: one container per command (built on first use, its pool
closed when the command ends), the command as one scope, and the operations'
errors as the command line's."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

import click

from app.container import Container
from app.errors import DomainError
from app.operations import TenantRef


@functools.cache
def container() -> Container:
    """The command's container (from the environment, embedded servers filled in)."""
    return Container.from_env()


@contextmanager
def command() -> Iterator[Container]:
    """The command as one scope of the container; a domain error ends it with its
    message, and the connection pool is closed at the end."""
    built = container()
    try:
        with built.scope():
            yield built
    except DomainError as exc:
        raise click.ClickException(exc.detail) from None
    finally:
        built.close()


@contextmanager
def for_tenant(name: str) -> Iterator[tuple[Container, TenantRef]]:
    """`command()`, for the tenant named `name` (an error if there is none)."""
    with command() as built:
        yield built, built.tenants.find(name)
