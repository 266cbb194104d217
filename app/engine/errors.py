"""Errors raised by the engine.

Every problem with user input is an :class:`InvalidInput` that names the offending field with a
JSON path (``domain.attributes[1].low``) and says what is wrong *without echoing the value*, so
the service can turn it into a problem+json body and logs never carry private data.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FieldError:
    """One problem with one field of a request.

    Attributes
    ----------
    field:
        JSON path of the field, e.g. ``history[3].query.epsilon``.
    message:
        What is wrong, phrased without repeating the submitted value.
    """

    field: str
    message: str


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class InvalidInput(EngineError):
    """A request, domain, query, value or output is malformed or out of range."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.errors: tuple[FieldError, ...] = (FieldError(field, message),)

    def __reduce__(self) -> tuple[type[InvalidInput], tuple[str, str]]:
        """Pickle with the constructor's arguments (errors cross process boundaries)."""
        return (type(self), (self.errors[0].field, self.errors[0].message))

    @property
    def field(self) -> str:
        """The path of the first offending field."""
        return self.errors[0].field

    @property
    def message(self) -> str:
        """The description of the first problem."""
        return self.errors[0].message


class Unsupported(EngineError):
    """The request is well formed but asks for something this version cannot compute."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def __reduce__(self) -> tuple[type[Unsupported], tuple[str, str]]:
        """Pickle with the constructor's arguments (errors cross process boundaries)."""
        return (type(self), (self.field, self.message))
