"""A task function's parameters and return value as the queue stores them.

At defer time the arguments are bound to the function's signature and checked against
its annotations (strictly: ``width="100"`` for an ``int`` is refused, not coerced), so
a bad argument is refused naming the parameter before anything is written, instead of
failing inside a worker and being retried. They are stored as JSON, which carries
datetimes, dates, UUIDs, Decimals, enums, dataclasses and pydantic models as their JSON
forms; the worker validates that JSON back into the annotated types. The same model
gives each task's parameters a JSON Schema, which a database records so that the
command line and the HTTP API can check arguments without importing the code.

pydantic does the work (one generated model per function, validated in Rust): it
already knows every one of those types, both directions and their schemas.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from typing import Any

import pydantic
from pydantic_core import PydanticSerializationError

from ledgerq.errors import InvalidInput

_EMPTY = inspect.Parameter.empty
_BY_NAME = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _annotations(fn: Callable[..., Any]) -> dict[str, Any]:
    """The function's annotations with forward references resolved (modules written with
    ``from __future__ import annotations`` hold them as strings)."""
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:  # a name the module does not define at decoration time
        raise InvalidInput(f"{_qualname(fn)}: cannot resolve its annotations: {exc}") from exc


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _problem(error: Any) -> str:
    """One pydantic error as "'param': what is wrong"."""
    where = ".".join(str(part) for part in error.get("loc", ()))
    return f"{where!r}: {error.get('msg', 'invalid')}" if where else error.get("msg", "invalid")


class TaskArguments:
    """A function's parameters: bound and checked at defer, stored as JSON, given back to
    the function as the annotated types in the worker."""

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        self.name = name
        self.signature = inspect.signature(fn)
        hints = _annotations(fn)
        fields: dict[str, Any] = {}
        self.takes_any_keyword = False
        for param in self.signature.parameters.values():
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                self.takes_any_keyword = True
                continue
            if param.kind not in _BY_NAME:
                # Stored by name, a run's arguments have no positions a worker could
                # restore: refused when the task is declared, not when it first runs.
                raise InvalidInput(f"task {name}: parameter {param.name!r} is "
                                   f"{param.kind.description}; a task's parameters must "
                                   "be passable by name")
            annotation = hints.get(param.name, Any)
            default = ... if param.default is _EMPTY else param.default
            fields[param.name] = (annotation, default)
        config = pydantic.ConfigDict(extra="allow" if self.takes_any_keyword else "forbid",
                                     arbitrary_types_allowed=False)
        try:
            self.model: type[pydantic.BaseModel] = pydantic.create_model(
                f"{name.replace('.', '_')}_arguments", __config__=config, **fields)
        except pydantic.PydanticSchemaGenerationError as exc:
            raise InvalidInput(f"task {name}: a parameter's type cannot be stored as JSON: "
                               f"{exc}") from None

    def encode(self, args: tuple[Any, ...] = (), kwargs: Mapping[str, Any] | None = None
               ) -> dict[str, Any]:
        """The arguments of one call as the JSON object the run stores; InvalidInput
        naming the parameter when they do not fit the signature or its types."""
        try:
            bound = self.signature.bind(*args, **(kwargs or {}))
        except TypeError as exc:
            raise InvalidInput(f"task {self.name}: {exc}") from None
        values = dict(bound.arguments)
        extra = next((p.name for p in self.signature.parameters.values()
                      if p.kind is inspect.Parameter.VAR_KEYWORD), None)
        if extra is not None:
            values.update(values.pop(extra, {}))
        try:
            checked = self.model.model_validate(values, strict=True)
        except pydantic.ValidationError as exc:
            raise InvalidInput(f"task {self.name}: argument "
                               f"{_problem(exc.errors()[0])}") from None
        return checked.model_dump(mode="json")

    def decode(self, stored: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments to call the function with, from what the run stores;
        InvalidInput when they no longer fit (the function changed since the defer)."""
        try:
            checked = self.model.model_validate(dict(stored))
        except pydantic.ValidationError as exc:
            raise InvalidInput(f"task {self.name}: stored argument "
                               f"{_problem(exc.errors()[0])}") from None
        values = {name: getattr(checked, name) for name in type(checked).model_fields}
        values.update(checked.model_extra or {})
        return values

    def json_schema(self) -> dict[str, Any]:
        """The parameters as a JSON Schema object (what a database records per task)."""
        return self.model.model_json_schema()


class TaskResult:
    """A task's return value: stored as JSON with the run's terminal fact, given back to
    the caller as the annotated type."""

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        self.name = name
        annotation = _annotations(fn).get("return", Any)
        self.adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(
            Any if annotation is None or annotation is type(None) else annotation)
        self.returns_none = annotation is None or annotation is type(None)

    def encode(self, value: Any) -> Any:
        """The return value as JSON; InvalidInput when it is not what the function
        declares or cannot be stored as JSON."""
        if self.returns_none:
            return None
        try:
            return self.adapter.dump_python(self.adapter.validate_python(value, strict=True),
                                            mode="json")
        except (pydantic.ValidationError, PydanticSerializationError) as exc:
            raise InvalidInput(f"task {self.name} returned {type(value).__name__}, which "
                               f"is not its declared return type: {exc}") from None

    def json_schema(self) -> dict[str, Any] | None:
        """The return value's JSON Schema (None for a task that returns nothing)."""
        return None if self.returns_none else self.adapter.json_schema()

    def decode(self, stored: Any) -> Any:
        """The stored JSON back as the declared return type."""
        return None if self.returns_none else self.adapter.validate_python(stored)


__all__ = ["TaskArguments", "TaskResult"]
