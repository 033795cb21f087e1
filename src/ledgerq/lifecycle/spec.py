"""The on-disk shape of a lifecycle spec file, decoded by msgspec.

Decoding straight into Structs means a malformed file fails with msgspec's own
``$.path`` pointer; :func:`decode_spec` prefixes the file name so an author
knows exactly which file and which item to fix.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import msgspec


class SpecError(ValueError):
    """A spec file (or a set of them) is invalid; ``problems`` lists every finding."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class StateSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    description: str


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


def decode_spec(path: Path) -> EntitySpec:
    """Read and type-check one spec file; errors name the file and the item."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SpecError([f"{path}: cannot read: {exc.strerror}"]) from exc
    try:
        # tomllib first: its errors carry line and column, msgspec's TOML errors do not.
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SpecError([f"{path}: not valid TOML: {exc}"]) from exc
    try:
        return msgspec.convert(data, type=EntitySpec)
    except msgspec.ValidationError as exc:
        raise SpecError([f"{path}: {exc}"]) from exc
