"""Task kinds a database records: submissions checked without the app's code.

An app records each task's name and its parameters' JSON Schema when it opens the
database (:func:`record`). A submission that names a kind outside the ADR-0071 queue's
list (the command line's ``ledgerq submit email.send --arg to=a@b``, ``POST
/api/tasks``, ``submit_task`` from another program) is accepted when the kind is
recorded and its args validate against that schema; refused, naming the argument,
otherwise. Nothing is imported from the app.

fastjsonschema does the validation: small, pure Python, it compiles each schema once to
a function. pydantic's dates and times are checked by the pattern pydantic itself
writes (an offset is optional), not by RFC 3339's stricter one.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import fastjsonschema

from ledgerq.codec import dumps, loads
from ledgerq.errors import InvalidInput

if TYPE_CHECKING:
    from ledgerq.lifecycle.store import Database
    from ledgerq.queue.submission.store import SubmissionTx

#: Date and time as pydantic writes them: ISO 8601, offset optional.
FORMATS = {
    "date-time": r"^\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d(:?\d\d)?)?$",
    "time": r"^\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d(:?\d\d)?)?$",
}


@dataclass(frozen=True)
class TaskKind:
    """One recorded task: its name, its parameters' JSON Schema, its default queue and
    its other defaults (``priority``, ``retry``, ``timeout``, ``capabilities``,
    ``target``: what a run the app did not defer itself, a state's ``on_enter``, takes)."""

    name: str
    parameters: dict[str, Any]
    returns: dict[str, Any] | None = None
    queue: str | None = None
    recorded_at: float | None = None
    defaults: dict[str, Any] | None = None

    def check(self, args: dict[str, Any]) -> None:
        """InvalidInput naming the argument when ``args`` do not fit the parameters."""
        validate = _validator(dumps(self.parameters))
        try:
            validate(args)
        except fastjsonschema.JsonSchemaValueException as exc:
            raise InvalidInput(f"task {self.name}: {_problem(exc)} "
                               "(checked against its recorded JSON Schema)") from None


    def coerce(self, args: dict[str, Any]) -> dict[str, Any]:
        """``args`` from a command line (every value text) with each value whose
        parameter takes no text read as JSON: ``retries=3`` is the integer 3 for an
        ``int`` parameter, and stays the text ``"3"`` for a ``str`` one."""
        properties = self.parameters.get("properties", {})
        out = dict(args)
        for name, value in args.items():
            schema = properties.get(name)
            if not isinstance(value, str) or not isinstance(schema, dict):
                continue
            accepted = _types(schema, self.parameters)
            if "string" in accepted or "any" in accepted:
                continue
            try:
                out[name] = loads(value)
            except Exception:  # left as text: the schema check names it
                continue
        return out


def _problem(exc: fastjsonschema.JsonSchemaValueException) -> str:
    """What is wrong, naming the argument: a missing or unexpected one by its name."""
    where = exc.path[1:] if exc.path and exc.path[0] == "data" else exc.path
    inside = ".".join(str(p) for p in where)
    prefix = f"{inside}: " if inside else ""
    value = exc.value if isinstance(exc.value, dict) else {}
    if exc.rule == "required" and isinstance(exc.rule_definition, list):
        missing = [r for r in exc.rule_definition if r not in value]
        return f"{prefix}missing argument {', '.join(repr(m) for m in missing)}"
    if exc.rule == "additionalProperties":
        known = set(exc.definition.get("properties", {})) if exc.definition else set()
        extra = [k for k in value if k not in known]
        return f"{prefix}unexpected argument {', '.join(repr(e) for e in extra)}"
    message = exc.message.removeprefix(exc.name or "").strip()
    return f"argument {inside!r}: {message}" if inside else message


def _types(schema: dict[str, Any], root: dict[str, Any], depth: int = 0) -> set[str]:
    """The JSON types a (pydantic-written) schema accepts; ``any`` when it cannot tell."""
    if depth > 16:
        return {"any"}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        return _types(target, root, depth + 1) if isinstance(target, dict) else {"any"}
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {str(k) for k in kind}
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list):
            found: set[str] = set()
            for option in options:
                if isinstance(option, dict):
                    found |= _types(option, root, depth + 1)
            return found
    if "enum" in schema and isinstance(schema["enum"], list):
        return {"string" if isinstance(v, str) else "other" for v in schema["enum"]}
    return {"any"}


@functools.lru_cache(maxsize=256)
def _validator(schema: str) -> Callable[[Any], Any]:
    # use_default=False: validation must not write the defaults into the caller's args.
    compiled: Callable[[Any], Any] = fastjsonschema.compile(loads(schema), formats=FORMATS,
                                                            use_default=False)
    return compiled


def _json(value: Any) -> Any:
    return loads(value) if isinstance(value, str | bytes) else value


def kind_of(row: Mapping[str, Any]) -> TaskKind:
    return TaskKind(name=row["name"], parameters=_json(row["parameters"]),
                    returns=_json(row["returns"]) if row.get("returns") else None,
                    queue=row.get("queue"), recorded_at=row.get("recorded_at"),
                    defaults=_json(row["defaults"]) if row.get("defaults") else None)


async def recorded(db: Database[SubmissionTx], names: Sequence[str] | None = None
                   ) -> dict[str, TaskKind]:
    """The recorded task kinds among ``names`` (None: all), by name."""
    rows = await db.read(lambda tx: tx.read_task_kinds(names))
    return {row["name"]: kind_of(row) for row in rows}


async def record(db: Database[SubmissionTx], kinds: Iterable[TaskKind]) -> int:
    """Record ``kinds`` (replacing what a name had); rows already equal are not written,
    so an app opening an unchanged database writes nothing. The number written."""
    wanted = {k.name: k for k in kinds}
    if not wanted:
        return 0
    have = await recorded(db, sorted(wanted))
    now = time.time()
    changed = [(k.name, dumps(k.parameters), dumps(k.returns) if k.returns else None,
                k.queue, now, dumps(k.defaults) if k.defaults else None)
               for k in wanted.values()
               if (h := have.get(k.name)) is None
               or (h.parameters, h.returns, h.queue, h.defaults)
               != (k.parameters, k.returns, k.queue, k.defaults)]
    if changed:
        await db.write(lambda tx: tx.record_task_kinds(changed))
    return len(changed)


__all__ = ["TaskKind", "record", "recorded"]
