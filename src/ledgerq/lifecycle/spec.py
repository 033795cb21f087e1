"""The on-disk shape of a lifecycle spec file, decoded by msgspec.

Decoding straight into Structs means a malformed file fails with msgspec's own
``$.path`` pointer; :func:`decode_spec` prefixes the file name so an author
knows exactly which file and which item to fix.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

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


class SpecError(ValueError):
    """A spec file (or a set of them) is invalid; ``problems`` lists every finding.

    The message is one line per problem, so an error that reaches a log or a traceback
    still names every file and item.
    """

    def __init__(self, problems: Iterable[SpecProblem]) -> None:
        self.problems: list[SpecProblem] = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class StateSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    description: str
    #: How a row that ends here ended (terminal states only): ``succeeded``, ``failed``,
    #: ``cancelled`` or ``skipped``. What "a dependency is met" and a status's colour mean.
    outcome: str | None = None


class EdgeSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    source: str = msgspec.field(name="from")
    to: list[str]
    actors: list[str] | None = None
    requires_guard: list[str] = []
    requires_patch: list[str] = []
    #: Patch columns the engine fills with a fresh random token when a request omits
    #: them (a lease's fencing token: callers written against the record never set it).
    fresh_tokens: list[str] = []
    description: str = ""


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


def decode_spec(path: Path) -> EntitySpec:
    """Read and type-check one spec file; errors name the file and the item."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SpecError([SpecProblem.whole_file(path, f"cannot read: {exc.strerror}")]) from exc
    try:
        # tomllib first: its errors carry line and column, msgspec's TOML errors do not.
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SpecError([SpecProblem.whole_file(path, f"not valid TOML: {exc}")]) from exc
    try:
        return msgspec.convert(data, type=EntitySpec)
    except msgspec.ValidationError as exc:
        raise SpecError([SpecProblem.from_msgspec(path, exc)]) from exc
