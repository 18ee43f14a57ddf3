"""The error a door's request reader raises for one field (a door answers 400)."""

from __future__ import annotations


class BadField(ValueError):
    """A field OpenAI's API has that this service refuses, or a value it cannot take."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param, self.message = param, message
