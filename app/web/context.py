"""What a request handler reaches: the process's container, its data plane and
the request's database session (the request is the unit of work: its session
closes at teardown). The only module of the HTTP door that reads `current_app`."""

from __future__ import annotations

from flask import Flask, current_app
from sqlalchemy.orm import Session

from app.container import Container
from app.dataplane import DataPlane


def container_of(app: Flask) -> Container:
    container: Container = app.extensions["container"]
    return container


def services() -> Container:
    return container_of(current_app)


def plane() -> DataPlane:
    return services().dataplane


def current_session() -> Session:
    """The request's session, made on first use, closed at the request's teardown."""
    return services().database.session()
