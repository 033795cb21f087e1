"""The on-disk shape of a lifecycle spec file, decoded by msgspec.

Decoding into Structs means a malformed file fails with msgspec's own ``$.path``
pointer; :func:`read_spec` prefixes the file name so an author knows exactly which file
and which item to fix. It decodes item by item rather than the whole document at once:
msgspec stops at the first error, and ``ledgerq specs check`` must name every one.
"""

from __future__ import annotations

import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from ledgerq.errors import SpecError as SpecError

#: msgspec puts the item after its message (``Expected `array`, got `str` - at `$.initial```)
#: and says nothing when the item is the whole document.
_MSGSPEC_AT = re.compile(r" - at `(\$[^`]*)`$")


@dataclass(frozen=True, slots=True)
class SpecProblem:
    """One finding, kept apart so a caller (``ledgerq specs check --json``) need not parse
    the sentence back into the file, the item and what is wrong with it.

    ``path`` is a ``$``-pointer into the file; ``$`` alone when the finding is about the
    whole file (unreadable, not TOML, no spec files at all).
    """

    file: str
    path: str
    message: str
    #: The line as ``str(SpecError)`` has always worded it, when that is not
    #: ``file: path: message`` (whole-file findings, msgspec's own sentences): callers
    #: match on those lines.
    wording: str | None = field(default=None, compare=False, repr=False)

    @classmethod
    def whole_file(cls, file: str | Path, message: str) -> SpecProblem:
        return cls(str(file), "$", message, wording=f"{file}: {message}")

    @classmethod
    def from_msgspec(cls, file: str | Path, exc: msgspec.ValidationError) -> SpecProblem:
        text = str(exc)
        at = _MSGSPEC_AT.search(text)
        path, message = (at.group(1), text[:at.start()]) if at is not None else ("$", text)
        return cls(str(file), path, message, wording=f"{file}: {text}")

    def __str__(self) -> str:
        if self.wording is not None:
            return self.wording
        return f"{self.file}: {self.path}: {self.message}"


class StateSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    description: str
    #: How a row that ends here ended (terminal states only): ``succeeded``, ``failed``,
    #: ``cancelled`` or ``skipped``. What "a dependency is met" and a status's colour mean.
    outcome: str | None = None
    #: Tasks deferred when a row enters this state, in the transaction of the move (or
    #: the creation) that enters it: a declarative outbox (``on_enter = ["shop.receipt"]``).
    on_enter: list[str] = []


class EdgeSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    source: str = msgspec.field(name="from")
    to: list[str]
    actors: list[str] | None = None
    requires_guard: list[str] = []
    requires_patch: list[str] = []
    #: Patch columns the engine fills with a fresh random token when a request omits
    #: them (a lease's fencing token: callers written against the ADR-0071 queue never set it).
    fresh_tokens: list[str] = []
    description: str = ""
    #: The event that takes this edge (``entity.send(id, "pay")``): one target only; an
    #: event names one edge out of each state.
    event: str | None = None
    #: The reason code a move along this edge records when its caller gives none.
    reason: str | None = None
    #: Column groups (``[column_groups]``) a move along this edge sets to NULL: rows
    #: leaving a state that holds a lease for one that must not (``clears = ["lease"]``).
    clears: list[str] = []


class ColumnSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A column in portable, logical terms; each database dialect renders its own DDL.

    ``type`` is one of text, integer, float, timestamp (epoch seconds as a float), json,
    boolean. A spec may write just the type (``ended_at = "timestamp"``) or a table.
    """

    type: str
    not_null: bool = False
    default: bool | int | float | str | None = None
    references: str | None = None
    on_delete: str | None = None


class IndexSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: str
    columns: list[str]
    unique: bool = False
    where_status: list[str] | None = None
    #: Partial index over rows where each of these columns IS NOT NULL.
    where_not_null: list[str] = []
    #: Columns (of ``columns``) the index keeps in descending order, so a query ordered
    #: by them descending and by the rest ascending reads the index in order, unsorted.
    descending: list[str] = []


class EntitySpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    entity: str
    table: str
    states: dict[str, StateSpec]
    initial: list[str]
    terminal: list[str]
    edges: list[EdgeSpec]
    reason_codes: dict[str, str]
    description: str = ""
    guard_columns: list[str] = []
    patch_columns: list[str] = []
    columns: dict[str, ColumnSpec | str] = {}
    indexes: list[IndexSpec] = []
    #: Named sets of columns code acts on together (the lease a requeue clears and a
    #: renewal guards on), so no caller lists them again.
    column_groups: dict[str, list[str]] = {}
    #: The actor types that may move this entity's rows (None: the ADR-0071 queue's
    #: five: scheduler, operator, system, webhook, agent).
    actors: list[str] | None = None


def decode_spec(path: Path) -> EntitySpec:
    """Read and type-check one spec file; errors name the file and every bad item."""
    decoded = read_spec(path)
    if decoded.problems or decoded.spec is None:
        raise SpecError(decoded.problems)
    return decoded.spec


@dataclass(frozen=True, slots=True)
class DecodedSpec:
    """A spec file decoded as far as it goes, so the registry can go on checking the rest.

    ``lost`` holds the ``$``-paths of what did not decode and was left out (an item of a
    list or table) or replaced by its default or an empty value (a field): a check that
    depends on one of them would only repeat the decoding problem in other words, so the
    registry skips it. ``spec`` is None when there is no document at all.
    """

    spec: EntitySpec | None
    problems: list[SpecProblem]
    lost: frozenset[str] = frozenset()


def read_spec(path: Path) -> DecodedSpec:
    """Read one spec file, reporting every item that does not decode, not just the first."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return DecodedSpec(None, [SpecProblem.whole_file(path, f"cannot read: {exc.strerror}")])
    try:
        # tomllib first: its errors carry line and column, msgspec's TOML errors do not.
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        return DecodedSpec(None, [SpecProblem.whole_file(path, f"not valid TOML: {exc}")])
    decoder = _Lenient(str(path))
    spec = decoder.struct(data, EntitySpec, "$", fill=True)
    assert isinstance(spec, EntitySpec)
    return DecodedSpec(spec, decoder.problems, frozenset(decoder.lost))


#: What an item that did not decode becomes: left out of its list or table.
_DROP: Any = object()
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _union(tp: Any) -> bool:
    return typing.get_origin(tp) in (types.UnionType, typing.Union)


def _struct_type(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct)


class _Lenient:
    """msgspec.convert applied item by item: each list element, each table value and each
    field of a Struct on its own, so one bad item is reported and the others still decode.

    It walks the Struct definitions themselves, so a field added to a spec Struct is
    decoded (and reported) the same way without a change here.
    """

    def __init__(self, file: str) -> None:
        self.file = file
        self.problems: list[SpecProblem] = []
        self.lost: set[str] = set()

    def bad(self, where: str, message: str, *, lose: bool = True) -> None:
        wording = f"{self.file}: {message}" + ("" if where == "$" else f" - at `{where}`")
        self.problems.append(SpecProblem(self.file, where, message, wording=wording))
        if lose:
            self.lost.add(where)

    def value(self, value: Any, tp: Any, where: str) -> Any:
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if _struct_type(tp):
            return self.struct(value, tp, where)
        if origin is list and isinstance(value, list):
            items = (self.value(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
            return [v for v in items if v is not _DROP]
        if origin is dict and isinstance(value, dict):
            table = {k: self.value(v, args[1], f"{where}.{k}" if _KEY.match(k)
                                   else f"{where}.{k!r}")
                     for k, v in value.items()}
            return {k: v for k, v in table.items() if v is not _DROP}
        structs = [a for a in args if _struct_type(a)] if _union(tp) else []
        if isinstance(value, dict) and len(structs) == 1:
            return self.struct(value, structs[0], where)
        return self.convert(value, tp, where)

    def convert(self, value: Any, tp: Any, where: str) -> Any:
        try:
            return msgspec.convert(value, type=tp)
        except msgspec.ValidationError as exc:
            text = str(exc)
            at = _MSGSPEC_AT.search(text)
            if at is None:
                self.bad(where, text)
            else:
                self.bad(where + at.group(1)[1:], text[:at.start()])
            self.lost.add(where)
            return _DROP

    def struct(self, value: Any, tp: type[msgspec.Struct], where: str,
               fill: bool = False) -> Any:
        """One Struct, field by field. ``fill``: a required field that is missing or bad
        becomes an empty value instead of dropping the whole Struct (the document itself)."""
        if not isinstance(value, dict):
            return self.convert(value, tp, where)  # refused: not a table
        fields = msgspec.structs.fields(tp)
        names = {f.encode_name for f in fields}
        if tp.__struct_config__.forbid_unknown_fields:
            for key in value:
                if key not in names:
                    # Reported, and the rest of the table still decodes.
                    self.bad(where, f"Object contains unknown field `{key}`", lose=False)
        kwargs: dict[str, Any] = {}
        complete = True
        for f in fields:
            required = f.default is msgspec.NODEFAULT and f.default_factory is msgspec.NODEFAULT
            here = f"{where}.{f.encode_name}"
            if f.encode_name in value:
                got = self.value(value[f.encode_name], f.type, here)
            else:
                got = _DROP
                if required:
                    self.bad(where, f"Object missing required field `{f.encode_name}`",
                             lose=False)
                    self.lost.add(here)
            if got is not _DROP:
                kwargs[f.name] = got
            elif required and fill:
                kwargs[f.name] = _empty(f.type)
            elif required:
                complete = False
        if not complete:
            self.lost.add(where)
            return _DROP
        return tp(**kwargs)


def _empty(tp: Any) -> Any:
    """The stand-in for a required top-level field that did not decode (its path is lost)."""
    origin = typing.get_origin(tp)
    return [] if origin is list else {} if origin is dict else ""
