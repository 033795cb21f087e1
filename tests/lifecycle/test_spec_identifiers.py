"""Nothing a spec file supplies reaches SQL unless it is a validated identifier or a
value of the closed type vocabulary."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerq.lifecycle import SpecError, load_registry
from ledgerq.lifecycle.identifiers import SQL_KEYWORDS
from ledgerq.lifecycle.registry import Registry, build_policy
from ledgerq.lifecycle.spec import EntitySpec
from ledgerq.store.sqlite.schema import create_schema
from test_registry import BASELINE

INJECTION = "ix ON notes(id); DROP TABLE status_transitions; CREATE INDEX IF NOT EXISTS ix_b"


def _spec(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = tomllib.loads(BASELINE)
    data["indexes"] = [{"name": "idx_widgets_owner", "columns": ["owner"]}]
    for path, value in changes.items():
        target = data
        keys = path.split("__")
        for key in keys[:-1]:
            target = target[int(key)] if isinstance(target, list) else target[key]
        last: Any = keys[-1]
        if isinstance(target, list):
            last = int(last)
        target[last] = value
    return data


def _refusal(data: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as info:
        build_policy(msgspec.convert(data, type=EntitySpec), "widget.toml")
    return str(info.value)


def test_the_reported_injection_in_an_index_name_is_refused() -> None:
    message = _refusal(_spec(indexes__0__name=INJECTION))
    assert "widget.toml: $.indexes[0].name" in message


def test_specs_check_refuses_it_naming_file_and_path(tmp_path: Path) -> None:
    spec = BASELINE + f'\n[[indexes]]\nname = "{INJECTION}"\ncolumns = ["owner"]\n'
    (tmp_path / "widget.toml").write_text(spec)
    out = subprocess.run([sys.executable, "-m", "ledgerq", "specs", "check", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "widget.toml" in out.stdout + out.stderr
    assert "$.indexes[0].name" in out.stdout + out.stderr


@pytest.mark.parametrize("change, where", [
    ({"entity": "widget\n"}, "$.entity"),
    ({"table": "widgets\n"}, "$.table"),
    ({"table": "w" * 64}, "$.table"),
    ({"indexes__0__name": "idx\n"}, "$.indexes[0].name"),
    ({"columns__owner": "TEXT); DROP TABLE status_transitions; --"}, "$.columns.owner"),
    ({"columns__owner": "TEXT NOT NULL"}, "$.columns.owner"),
    ({"columns__owner": {"type": "text", "default": 5}}, "$.columns.owner.default"),
    ({"columns__owner": {"type": "integer", "default": True}}, "$.columns.owner.default"),
    ({"columns__owner": {"type": "json", "default": "[]"}}, "$.columns.owner.default"),
    ({"columns__owner": {"type": "text", "references": "x; DROP"}},
     "$.columns.owner.references"),
    ({"columns__owner": {"type": "text", "on_delete": "cascade"}},
     "$.columns.owner.on_delete"),
    ({"columns__owner": {"type": "text", "references": "widgets", "on_delete": "explode"}},
     "$.columns.owner.on_delete"),
    ({"indexes__0__columns": []}, "$.indexes[0].columns"),
    ({"indexes__0__columns": ["nope"]}, "$.indexes[0].columns[0]"),
])
def test_each_identifier_and_type_position_is_validated(change: dict[str, Any],
                                                        where: str) -> None:
    assert f"widget.toml: {where}" in _refusal(_spec(**change))


def test_a_trailing_newline_is_refused_in_states_and_reason_codes() -> None:
    data = _spec()
    data["states"]["busy\n"] = data["states"].pop("busy")
    assert "$.states.'busy\\n'" in _refusal(data)
    data = _spec()
    data["reason_codes"]["widget.done.ok\n"] = "x"
    assert "malformed reason code" in _refusal(data)


def test_column_drop_reported_once_names_the_type_vocabulary() -> None:
    message = _refusal(_spec(columns__owner="REAL"))
    assert "unknown column type 'REAL'; known: text, integer, float, timestamp, json, boolean" \
        in message


def test_registry_refusals_without_fixture_files() -> None:
    """Each refusal asserted by its message, not only by raising."""
    assert "is a standard column the engine maintains" in _refusal(
        _spec(columns__status="text"))
    assert "$.edges[0].to: an edge needs at least one target" in _refusal(
        _spec(edges__0__to=[]))
    assert "$.initial: at least one initial state is required" in _refusal(_spec(initial=[]))
    assert "$.terminal: at least one terminal state is required" in _refusal(
        _spec(terminal=[]))
    assert "$.indexes[0].columns[0]: column 'ghost' is not in the table" in _refusal(
        _spec(indexes__0__columns=["ghost"]))


def test_duplicate_errors_name_entity_and_table_paths(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text(BASELINE)
    (tmp_path / "b.toml").write_text(BASELINE)
    with pytest.raises(SpecError) as info:
        load_registry(tmp_path)
    problems = [str(p) for p in info.value.problems]
    assert any("b.toml: $.entity: duplicate entity 'widget'" in p for p in problems)
    assert any("b.toml: $.table: duplicate table 'widgets'" in p for p in problems)


async def test_reserved_objects_are_every_name_the_base_schemas_take(
        pg_database: str) -> None:
    """Every name ledgerq's own schema takes, on SQLite and on PostgreSQL (whose tables,
    indexes, triggers and functions share what a spec may name), and no other."""
    from helpers import pg
    from ledgerq import StateDB
    from ledgerq.lifecycle.registry import RESERVED_OBJECTS

    conn = sqlite3.connect(":memory:")
    create_schema(conn, load_registry())
    policies = load_registry().policies()
    spec_names = {p.table for p in policies} | {ix.name for p in policies for ix in p.indexes}
    on_sqlite = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")
                 if not r[0].startswith("sqlite_autoindex")} - spec_names
    url = pg.create_schema(pg_database, "reserved_names")
    try:
        async with StateDB(url) as db:
            names = await db.fetch_all(
                "SELECT relname AS name FROM pg_class WHERE relnamespace = "
                "'reserved_names'::regnamespace UNION SELECT proname FROM pg_proc WHERE "
                "pronamespace = 'reserved_names'::regnamespace UNION SELECT tgname FROM "
                "pg_trigger WHERE NOT tgisinternal")
    finally:
        pg.drop_schema(pg_database, "reserved_names")
    pkeys = {f"{t}_pkey" for t in {p.table for p in policies} | {
        "status_transitions", "workers", "schedules", "invocations", "ledgerq_schema",
        "ledgerq_specs", "ledgerq_spec_versions", "ledgerq_archives", "ledgerq_archive_batch"}}
    on_postgres = {r["name"] for r in names} - spec_names - pkeys
    # A SQLite table rebuild's new table exists only inside the migration's transaction.
    assert on_sqlite | on_postgres == RESERVED_OBJECTS - {"ledgerq_rebuild"}


def test_an_index_named_like_a_table_or_another_index_is_refused(tmp_path: Path) -> None:
    for name in ("widgets", "uq_status_transitions_version", "idx_schedule_runs_claim_order"):
        (tmp_path / "w.toml").write_text(
            BASELINE + f'\n[[indexes]]\nname = "{name}"\ncolumns = ["owner"]\n')
        (tmp_path / "schedule_run.toml").write_bytes(
            (Path(__file__).resolve().parents[2] / "specs" / "schedule_run.toml").read_bytes())
        with pytest.raises(SpecError, match=r"\$\.indexes\[0\]\.name: .* is already"):
            load_registry(tmp_path)


def test_a_reference_to_an_unknown_table_is_refused(tmp_path: Path) -> None:
    (tmp_path / "w.toml").write_text(BASELINE.replace(
        'owner = "text"', 'owner = { type = "text", references = "nowhere" }'))
    with pytest.raises(SpecError, match=r"\$\.columns\.owner\.references: unknown table"):
        load_registry(tmp_path)


# ------------------------------------------------------------ hypothesis

#: Every position of a spec whose string reaches the schema.
POSITIONS = ["entity", "table", "state", "column", "column_type", "index", "index_column",
             "reason_code", "references", "default", "where_not_null"]

hostile = st.one_of(
    st.text(max_size=40),
    # SQL keywords are valid names (quoted everywhere): they must work, not break SQL.
    st.sampled_from(sorted(SQL_KEYWORDS)),
    st.sampled_from([INJECTION, "x\n", "x;", "x\"", "x'", "select", "drop", "a b", "",
                     "widgets", "status_transitions", "TEXT; DROP TABLE status_transitions",
                     "x) ; DROP TABLE status_transitions; --", "é", "x\x00"]),
    st.from_regex(r"[a-z_][a-z0-9_]{0,10}\n?", fullmatch=True),
)


def _with(position: str, value: str) -> dict[str, Any]:
    data = _spec()
    if position == "entity":
        data["entity"] = value
    elif position == "table":
        data["table"] = value
    elif position == "state":
        data["states"][value] = data["states"].pop("busy")
        data["edges"][0]["to"] = [value, "done"]
        data["edges"][1]["from"] = value
    elif position == "column":
        data["columns"][value] = "text"
        data["indexes"][0]["columns"] = [value]
    elif position == "column_type":
        data["columns"]["owner"] = value
    elif position == "index":
        data["indexes"][0]["name"] = value
    elif position == "index_column":
        data["indexes"][0]["columns"] = [value]
    elif position == "reason_code":
        data["reason_codes"][value] = "x"
    elif position == "references":
        data["columns"]["owner"] = {"type": "text", "references": value}
    elif position == "default":
        data["columns"]["note"] = {"type": "text", "default": value}
    elif position == "where_not_null":
        data["indexes"][0]["where_not_null"] = [value]
    return data


def _objects(conn: sqlite3.Connection) -> set[tuple[str, str]]:
    return {(r[0], r[1]) for r in conn.execute("SELECT type, name FROM sqlite_master")}


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(position=st.sampled_from(POSITIONS), value=hostile)
def test_any_string_in_any_identifier_position_is_refused_or_inert(position: str,
                                                                   value: str) -> None:
    data = _with(position, value)
    try:
        policy = build_policy(msgspec.convert(data, type=EntitySpec), "fuzz.toml")
    except (SpecError, msgspec.ValidationError):
        return
    if policy.table in ("schedule_runs", "dispatch_outbox"):
        return
    base = load_registry()
    conn = sqlite3.connect(":memory:")
    try:
        create_schema(conn, base)
        conn.execute("INSERT INTO status_transitions (id, entity_type, entity_id, status, "
                     "reason_code, source, created_at, entity_version, patch) "
                     "VALUES ('f', 'e', 'i', 's', 'a.b.c', 'system', 1, 1, '{}')")
        before = _objects(conn)
        log_before = conn.execute("SELECT * FROM status_transitions").fetchall()
        try:
            registry = Registry([*base.policies(), policy])
        except SpecError:
            return
        create_schema(conn, registry)
        expected = before | {("table", policy.table)} | {("index", ix.name)
                                                           for ix in policy.indexes}
        added = _objects(conn) - before
        assert _objects(conn) >= before
        assert {o for o in added if not o[1].startswith("sqlite_autoindex")} \
            == expected - before
        assert conn.execute("SELECT * FROM status_transitions").fetchall() == log_before
    finally:
        conn.close()
