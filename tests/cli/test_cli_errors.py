"""How the ``ledgerq`` command fails and what it prints.

Every test drives the installed console script in a real subprocess: the entry point
(``main``) is what turns click's usage errors and database failures into one line, so
typer's in-process runner would skip exactly what is under test.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.unprivileged import without_write_permission
from ledgerq import StateDB
from ledgerq.lifecycle import Actor
from ledgerq.queue import (
    TaskApplication,
    cancel_task,
    claim_runs,
    register_heartbeat,
    submit_many,
)


def _console_script() -> str:
    found = shutil.which("ledgerq", path=str(Path(sys.executable).parent)) or \
        shutil.which("ledgerq")
    if found is None:
        pytest.skip("the ledgerq console script is not installed (pip install -e .)",
                    allow_module_level=True)
    return found


LEDGERQ = _console_script()
#: Wide enough that rich never wraps a table cell in the middle of what a test looks for.
WIDE = {"COLUMNS": "1000"}


def cli(*args: str | bytes | Path, env: dict[str, str] | None = None,
        prefix: list[str] | None = None, timeout: float = 60, cwd: Path | None = None
        ) -> subprocess.CompletedProcess[str]:
    """Run ``ledgerq``; bytes arguments go to the process as they are (not UTF-8 ones too)."""
    base = {k: v for k, v in os.environ.items() if k not in ("LEDGERQ_DB", "LEDGERQ_SYNCHRONOUS")}
    argv: list[str | bytes] = [*(prefix or []), LEDGERQ,
                               *(a if isinstance(a, bytes) else str(a) for a in args)]
    return subprocess.run(argv, capture_output=True, text=True, errors="surrogateescape",
                          env={**base, **(env or {})}, timeout=timeout, check=False,
                          cwd=cwd)


def one_error_line(res: subprocess.CompletedProcess[str], code: int) -> str:
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("ledgerq: error: "), lines[0]
    assert "Traceback" not in res.stdout + res.stderr
    return lines[0]


def counts(db: Path) -> tuple[int, int]:
    with sqlite3.connect(db) as conn:
        runs = conn.execute("SELECT COUNT(*) FROM schedule_runs").fetchone()[0]
        facts = conn.execute("SELECT COUNT(*) FROM status_transitions").fetchone()[0]
    return runs, facts


COMMAND = TaskApplication(action_kind="command", args={"argv": ["true"]},
                          execution_target="host")


def lib_submit(db: Path, *apps: TaskApplication) -> list[str]:
    async def go() -> list[str]:
        async with StateDB(db) as handle:
            return await submit_many(handle, apps)

    return asyncio.run(go())


@pytest.fixture
def seeded(tmp_path: Path) -> Path:
    db = tmp_path / "q.db"
    lib_submit(db, COMMAND)
    return db


# ----------------------------------------------------------------- usage errors


USAGE_ERRORS = [
    (["ls", "--frob"], "No such option: --frob", "ledgerq ls --help"),
    (["submit"], "Missing argument 'KIND'", "ledgerq submit --help"),
    (["ls", "--limit", "many"], "Invalid value for '--limit'", "ledgerq ls --help"),
    (["frobnicate"], "No such command 'frobnicate'", "ledgerq --help"),
    (["specs", "graph"], "Missing argument 'ENTITY'", "ledgerq specs graph --help"),
    (["specs", "frob"], "No such command 'frob'", "ledgerq specs --help"),
    (["worker", "--capacity", "0"], "Invalid value for '--capacity'", "ledgerq worker --help"),
    (["--db"], "Option '--db' requires an argument", "ledgerq --help"),
]


@pytest.mark.parametrize(("args", "message", "hint"), USAGE_ERRORS,
                         ids=[" ".join(a) for a, _, _ in USAGE_ERRORS])
def test_usage_errors_are_one_line_exit_2(args: list[str], message: str, hint: str) -> None:
    line = one_error_line(cli(*args), 2)
    assert message in line and hint in line
    assert "╭" not in line and "│" not in line  # no rich box


def test_help_still_prints_and_exits_0() -> None:
    for args in (["--help"], ["-h"], ["ls", "--help"], ["specs", "check", "-h"]):
        res = cli(*args)
        assert res.returncode == 0, (args, res.stderr)
        assert "Usage" in res.stdout and res.stderr == ""
    res = cli("--version")
    assert (res.returncode, res.stdout.strip()) == (0, "ledgerq 0.1.0")


def test_no_command_prints_the_help() -> None:
    res = cli()
    assert res.returncode == 2 and "Usage" in res.stdout + res.stderr
    assert "Traceback" not in res.stderr


def test_module_entry_point_has_the_same_errors() -> None:
    res = subprocess.run([sys.executable, "-m", "ledgerq", "ls", "--frob"], capture_output=True,
                         text=True, check=False, timeout=60)
    assert "No such option: --frob" in one_error_line(res, 2)


@pytest.mark.parametrize("command", [["submit", "command"], ["worker"], ["cancel", "abcd"]],
                         ids=["submit", "worker", "cancel"])
def test_db_under_a_missing_directory_is_one_line(tmp_path: Path, command: list[str]) -> None:
    missing = tmp_path / "no" / "such" / "dir" / "q.db"
    extra = ["--", "true"] if command[0] == "submit" else []
    # The "Event loop is closed" traceback was a race: try a few times to give it room.
    for _ in range(3):
        res = cli(*command, "--db", missing, *extra)
        assert "Event loop is closed" not in res.stderr
        line = one_error_line(res, 2)
        assert str(missing) in line
    assert not missing.parent.exists()


def test_run_waits_for_the_thread_of_a_connection_that_failed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cause of that traceback, in process: aiosqlite's thread for a connection that
    failed to open posts one last result to the loop. Without the wait in ``cli.run``,
    about one run in five here closed the loop first and the thread died with "Event loop
    is closed" (50 runs: a miss is all but certain); with it, none does."""
    import threading

    import aiosqlite

    from ledgerq import cli as cli_module

    errors: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda hook: errors.append(hook.exc_value))
    missing = tmp_path / "no" / "q.db"

    async def refused() -> str:
        try:
            await aiosqlite.connect(missing)
        except sqlite3.OperationalError:
            return "refused"
        return "opened"

    for _ in range(50):
        assert cli_module.run(refused()) == "refused"
        assert not [t for t in threading.enumerate()
                    if t.name.endswith(cli_module._DB_THREAD_SUFFIX) and t.is_alive()]
    assert errors == []


# ----------------------------------------------------------------- input


DEEP = "[" * 5000 + "]" * 5000

BAD_INPUT: list[tuple[list[str | bytes], str]] = [
    (["command", "--", b"\xff"], "args['argv'][0] is not valid UTF-8 text"),
    (["command", "--", "echo", b"a\xffb"], "args['argv'][1] is not valid UTF-8 text"),
    (["command", "--argv", b"echo \xfe"], "args['argv'][1] is not valid UTF-8 text"),
    (["flow", "--arg", b"k=\xff"], "args['k'] is not valid UTF-8 text"),
    (["flow", "--arg", b"\xff=v"], "a key of args"),
    (["flow", "--args", b'{"k": "\xff"}'], "args['k'] is not valid UTF-8 text"),
    (["flow", "--args", '{"k": "\\ud800"}'], "lone surrogate U+D800"),
    (["flow", "--idempotency-key", b"\xff"], "idempotency_key is not valid UTF-8 text"),
    (["flow", "--cap", b"gpu\xff"], "required_capabilities[0] is not valid UTF-8 text"),
    (["flow", "--library-ref", b"\xff"], "library_ref is not valid UTF-8 text"),
    (["flow", "--depends-on", b"\xff"], "depends_on[0] is not valid UTF-8 text"),
    (["flow", "--args", '{"k": ' + DEEP + "}"], "nested too deeply"),
    (["flow", "--arg", "k:=" + DEEP], "nested too deeply"),
    (["flow", "--idempotency-key", "k" * 300], "idempotency_key is 300 characters long"),
    (["command", "--args", '{"argv": ["a\\u0000b"]}'], "args['argv'][0] contains a NUL"),
    (["command", "--args", '{"argv": ["true", 1]}'], "args['argv'][1] must be a string"),
    (["command", "--args", '{"argv": ["true"], "cwd": 7}'], "args['cwd']"),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUT, ids=[
    " ".join(a.decode(errors="backslashreplace") if isinstance(a, bytes) else a[:30]
             for a in args) for args, _ in BAD_INPUT])
def test_bad_input_is_one_line_naming_the_field_exit_2(
        seeded: Path, args: list[str | bytes], message: str) -> None:
    before = counts(seeded)
    line = one_error_line(cli("submit", *args, "--db", seeded), 2)
    assert message in line
    assert len(line) < 500
    assert counts(seeded) == before


def test_many_unknown_dependencies_make_a_short_message(seeded: Path) -> None:
    deps: list[str] = []
    for i in range(1000):
        deps += ["--depends-on", f"no-such-run-{i:04d}"]
    line = one_error_line(cli("submit", "flow", *deps, "--db", seeded), 2)
    assert "1,000 unknown run id(s)" in line and "and 990 more" in line
    assert len(line) < 600


OTHER_TEXT: list[tuple[list[str | bytes], dict[str, str] | None, str]] = [
    (["show", b"ab\xffcd"], None, "ID is not valid UTF-8 text"),
    (["cancel", b"ab\xffcd"], None, "ID is not valid UTF-8 text"),
    (["cancel", "RUN", "--actor", b"\xff"], None, "--actor is not valid UTF-8 text"),
    (["cancel", "RUN", "--reason", b"why\xff"], None, "--reason is not valid UTF-8 text"),
    (["cancel", "RUN"], {"LOGNAME": "x\udcff", "USER": "x\udcff"},
     "the user name (LOGNAME/USER) is not valid UTF-8"),
    (["worker", "--worker-id", b"w\xff"], None, "--worker-id is not valid UTF-8 text"),
    (["worker", "--cap", b"gpu\xff"], None, "--cap[0] is not valid UTF-8 text"),
]


@pytest.mark.parametrize(("args", "env", "message"), OTHER_TEXT,
                         ids=["show", "cancel", "actor", "reason", "user", "worker-id", "cap"])
def test_text_stored_by_other_commands_must_be_utf8(
        seeded: Path, args: list[str | bytes], env: dict[str, str] | None,
        message: str) -> None:
    with sqlite3.connect(seeded) as conn:
        run_id = conn.execute("SELECT id FROM schedule_runs").fetchone()[0]
    before = counts(seeded)
    argv = [run_id if a == "RUN" else a for a in args]
    line = one_error_line(cli(*argv, "--db", seeded, env=env), 2)
    assert message in line
    assert counts(seeded) == before


# ----------------------------------------------------------------- terminal injection


#: Screen clear, window title (OSC ... BEL), a C1 CSI, a bidi override, DEL; then rich
#: markup, a hyperlink and an emoji code that must all show as typed.
HOSTILE = ("\x1b[2J\x1b]0;owned\x07\x9b31m\u202eevil\x7f "
           "[red]red[/red] [link=https://evil.example]click[/link] :smile:")
RAW_CONTROLS = ("\x1b", "\x07", "\x9b", "\u202e", "\x7f")
LITERAL = ("[red]red[/red]", "[link=https://evil.example]click[/link]", ":smile:",
           "\\x1b[2J", "\\x9b31m", "\\u202eevil", "\\x07")


def _seed_hostile(db: Path) -> tuple[str, str]:
    """Two runs full of hostile text, written through the library as a user could."""

    async def go() -> tuple[str, str]:
        async with StateDB(db) as handle:
            noted, leased = await submit_many(handle, [
                TaskApplication(action_kind="command", execution_target="host",
                                args={"argv": ["true", HOSTILE], "note": HOSTILE},
                                idempotency_key="key " + HOSTILE),
                COMMAND,
            ])
            await cancel_task(handle, noted, actor=Actor(type="operator", id="op " + HOSTILE),
                              summary="why " + HOSTILE)
            await register_heartbeat(handle, worker_id="w " + HOSTILE)
            await claim_runs(handle, worker_id="w " + HOSTILE)
        return noted, leased

    noted, leased = asyncio.run(go())
    with sqlite3.connect(db) as conn:  # a stderr tail as a task could have written it
        conn.execute("UPDATE schedule_runs SET error_detail = ? WHERE id = ?",
                     ("detail " + HOSTILE, noted))
    return noted, leased


def _assert_escaped(res: subprocess.CompletedProcess[str]) -> None:
    shown = res.stdout + res.stderr
    for raw in RAW_CONTROLS:
        assert raw not in shown, (raw, shown)
    for literal in LITERAL:
        assert literal in shown, (literal, shown)


def test_human_output_escapes_controls_and_shows_markup_literally(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    noted, _ = _seed_hostile(db)
    show = cli("show", noted, "--db", db, env=WIDE)
    assert show.returncode == 0, show.stderr
    _assert_escaped(show)
    for field in ("detail ", "op ", "why ", "key ", "note"):
        assert field in show.stdout
    ls = cli("ls", "--db", db, env=WIDE)
    assert ls.returncode == 0, ls.stderr
    assert "w \\x1b[2J" in ls.stdout  # WORKER column: the lease holder of the second run
    _assert_escaped(ls)
    stats = cli("stats", "--db", db, env=WIDE)
    assert stats.returncode == 0, stats.stderr
    assert "w \\x1b[2J" in stats.stdout
    _assert_escaped(stats)
    verify = cli("verify", "--db", db, env=WIDE)  # error_detail was changed behind the log
    assert verify.returncode == 1 and "drift" in verify.stdout
    _assert_escaped(verify)
    assert "detail \\x1b[2J" in verify.stdout


def test_json_output_keeps_the_exact_strings(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    noted, _ = _seed_hostile(db)
    shown = json.loads(cli("show", noted, "--json", "--db", db).stdout)
    assert shown["run"]["error_detail"] == "detail " + HOSTILE
    assert shown["run"]["action_args"] == {"argv": ["true", HOSTILE], "note": HOSTILE}
    assert shown["run"]["idempotency_key"] == "key " + HOSTILE
    last = shown["history"][-1]
    assert (last["actor"], last["reason_summary"]) == ("op " + HOSTILE, "why " + HOSTILE)
    listed = json.loads(cli("ls", "--json", "--db", db).stdout)
    assert {r["leased_by"] for r in listed["runs"]} == {None, "w " + HOSTILE}
    stats = json.loads(cli("stats", "--json", "--db", db).stdout)
    assert "w " + HOSTILE in _strings(stats)


def _strings(value: object) -> set[str]:
    """Every string inside a decoded JSON value (keys and values)."""
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return set().union(*(_strings(k) | _strings(v) for k, v in value.items()))
    if isinstance(value, list):
        return set().union(*(_strings(v) for v in value))
    return set()


def test_error_lines_escape_what_they_quote(seeded: Path) -> None:
    line = one_error_line(cli("show", "\x1b[2Jgone", "--db", seeded), 1)
    assert "\x1b" not in line and "\\x1b[2Jgone" in line


def test_printable_escapes_exactly_the_unsafe_characters() -> None:
    from ledgerq.cli import cell, printable

    assert printable("plain é ü 日本 ✓ tab\there") == "plain é ü 日本 ✓ tab\\x09here"
    assert printable("a\nb\r\x00\x1f\x7f\x80\x9f\xa0") == \
        "a\\x0ab\\x0d\\x00\\x1f\\x7f\\x80\\x9f\xa0"
    assert printable("\u202e\u2066\u200f\u2028x\udcff") == "\\u202e\\u2066\\u200f\\u2028x\\udcff"
    assert printable(42) == "42"
    assert cell("[red]x[/red]").markup == "\\[red]x\\[/red]"  # a Text: never parsed as markup


# ----------------------------------------------------------------- a damaged file


def _damage(path: Path) -> None:
    """Overwrite every third page in the middle of the file with garbage (a bad disk)."""
    size, page = path.stat().st_size, 4096
    with path.open("r+b") as f:
        for n in range(2, size // page - 1, 3):
            f.seek(n * page)
            f.write(os.urandom(page))


@pytest.fixture(scope="module")
def damaged_original(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    db = tmp_path_factory.mktemp("damaged") / "orig.db"
    ids = lib_submit(db, *[COMMAND] * 3000)
    _damage(db)
    return db, ids[1500]


DAMAGED_COMMANDS = [["ls"], ["ls", "--json"], ["stats"], ["stats", "--json"], ["verify"],
                    ["verify", "--json"], ["show", "RUN"], ["cancel", "RUN"], ["rebuild"]]


@pytest.mark.parametrize("command", DAMAGED_COMMANDS, ids=[" ".join(c) for c in DAMAGED_COMMANDS])
def test_a_damaged_file_is_one_line_exit_1(tmp_path: Path, damaged_original: tuple[Path, str],
                                           command: list[str]) -> None:
    original, run_id = damaged_original
    db = tmp_path / "q.db"
    shutil.copyfile(original, db)
    res = cli(*[run_id if a == "RUN" else a for a in command], "--db", db)
    line = one_error_line(res, 1)
    assert line.startswith("ledgerq: error: database is damaged: ") and str(db) in line
    assert res.stdout == ""


def test_submit_to_a_damaged_file_never_prints_a_traceback(
        tmp_path: Path, damaged_original: tuple[Path, str]) -> None:
    """Whether a write reaches a damaged page depends on where it lands (refusing writes
    to a file that was closed cleanly is the store's half); the command's part is that a
    failure is one line, exit 1."""
    db = tmp_path / "q.db"
    shutil.copyfile(damaged_original[0], db)
    res = cli("submit", "command", "--db", db, "--", "true")
    if res.returncode != 0:
        assert "database is damaged" in one_error_line(res, 1)


def test_garbage_that_is_not_a_database_is_one_line(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    db.write_bytes(os.urandom(8192))
    for command in (["ls"], ["stats"], ["verify"], ["show", "abcd"]):
        line = one_error_line(cli(*command, "--db", db), 1)
        assert "database is damaged" in line or "not a database" in line, line


def test_a_sqlite_file_without_ledgerqs_schema_is_refused_unchanged(tmp_path: Path) -> None:
    db = tmp_path / "other.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (x)")
    before = db.read_bytes()
    for command in (["ls"], ["stats"], ["verify"], ["show", "abcd"]):
        line = one_error_line(cli(*command, "--db", db), 1)
        assert "no ledgerq schema" in line
    assert db.read_bytes() == before


# ----------------------------------------------------------------- read-only access


READ_COMMANDS = [["ls"], ["ls", "--json"], ["stats"], ["stats", "--json"], ["verify"],
                 ["verify", "--json"], ["show", "RUN"], ["show", "RUN", "--json"]]


def _snapshot(directory: Path) -> dict[str, tuple[bytes, int, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_mode)
            for p in sorted(directory.iterdir())}


def _read_commands(db: Path, run_id: str, prefix: list[str] | None = None) -> None:
    for command in READ_COMMANDS:
        res = cli(*[run_id if a == "RUN" else a for a in command], "--db", db, prefix=prefix)
        assert res.returncode == 0, (command, res.stderr)
        assert res.stderr.strip() == "" or "run(s)" in res.stderr, (command, res.stderr)
        if command == ["ls", "--json"]:
            assert json.loads(res.stdout)["total"] == 2
        if command == ["show", "RUN", "--json"]:
            assert json.loads(res.stdout)["run"]["id"] == run_id


def _only_the_database(directory: Path) -> tuple[Path, str]:
    db = directory / "q.db"
    run_id = lib_submit(db, COMMAND, COMMAND)[0]
    for other in directory.iterdir():  # e.g. a writer's lock file: a reader makes none
        if other != db:
            other.unlink()
    return db, run_id


def test_read_commands_leave_the_database_file_as_it_was(tmp_path: Path) -> None:
    db, run_id = _only_the_database(tmp_path)
    before = _snapshot(tmp_path)
    _read_commands(db, run_id)
    after = _snapshot(tmp_path)
    assert after["q.db"] == before["q.db"]  # same bytes, mtime and mode
    assert not any(name.endswith(".lock") for name in after)  # no writer's lock taken


def test_read_commands_change_no_database_byte(tmp_path: Path) -> None:
    """Read commands leave the database file exactly as it was. Where the directory is
    writable SQLite may create its WAL index files (-wal, -shm) for a read-only
    connection: they are SQLite's locking state, not data, and the next writer uses
    them (docs/decisions.md); nothing else may appear."""
    db, run_id = _only_the_database(tmp_path)
    before = _snapshot(tmp_path)
    _read_commands(db, run_id)
    after = _snapshot(tmp_path)
    assert {k: v for k, v in after.items() if k in before} == before
    assert {Path(k).name for k in set(after) - set(before)} <= {
        db.name + "-wal", db.name + "-shm"}


def test_read_commands_work_without_write_permission(tmp_path: Path) -> None:
    prefix = without_write_permission()
    if prefix is None:
        pytest.skip("setpriv is not available to drop the permission override")
    directory = tmp_path / "ro"
    directory.mkdir()
    db, run_id = _only_the_database(directory)
    db.chmod(0o444)
    directory.chmod(0o555)
    try:
        probe = subprocess.run([*prefix, sys.executable, "-c",
                                f"open({str(db)!r}, 'ab')"], capture_output=True, check=False)
        if probe.returncode == 0:
            pytest.skip("cannot take write permission away here (the probe could write)")
        before = _snapshot(directory)
        _read_commands(db, run_id, prefix=prefix)
        assert _snapshot(directory) == before
        # and a write command says why in one line instead of a traceback
        res = cli("cancel", run_id, "--db", db, prefix=prefix)
        assert res.returncode in (1, 2)
        one_error_line(res, res.returncode)
        assert _snapshot(directory) == before
    finally:
        directory.chmod(0o755)
        db.chmod(0o644)


@pytest.mark.parametrize("command", [["submit", "command", "--", "true"], ["ls"], ["worker"]],
                         ids=["submit", "ls", "worker"])
@pytest.mark.parametrize("given", ["flag", "env"])
def test_a_libpq_keyword_string_is_refused_not_made_a_file(tmp_path: Path, command: list[str],
                                                           given: str) -> None:
    """``host=... dbname=...`` is not a URL: it used to become a SQLite file of that name."""
    target = "host=127.0.0.1 port=5432 dbname=jobs"
    args = [command[0], "--db", target, *command[1:]] if given == "flag" else command
    env = {"LEDGERQ_DB": target} if given == "env" else None
    line = one_error_line(cli(*args, env=env, cwd=tmp_path), 2)
    assert "--db:" in line and "postgresql://" in line and repr(target) in line
    assert list(tmp_path.iterdir()) == []
