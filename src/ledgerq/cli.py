"""The ``ledgerq`` command: submit, watch, cancel, verify and run workers.

Exit codes (every command):

* 0 — success.
* 1 — a domain failure: a cancel that conflicts (the run had already ended), an
  unknown run id (``no run <id>``), drift found by ``verify``, an invalid spec; or a
  database failure: a damaged file (``database is damaged: <file>: ...``), a file
  without ledgerq's schema, any database error after the open.
* 2 — a usage or validation error: bad options, an application the queue refuses
  (unknown kind or target, args that are not a JSON object, unknown dependency, a
  limit exceeded, text that is not UTF-8), a missing database file for a read command,
  a database path SQLite cannot open. Nothing is written.

Errors are one line on stderr, prefixed ``ledgerq: error:`` (usage errors too: see
:func:`run_cli`), never a traceback. Human-readable output escapes control characters
(:func:`printable`); every read command has ``--json`` whose keys are a stable contract
(see docs and tests/test_cli.py) and whose strings are exact. Read commands (``ls``,
``show``, ``stats``, ``verify``) open the database read-only.
The database comes from ``--db`` (on the command or before it), else ``LEDGERQ_DB``,
else ``./ledgerq.db``.
"""

from __future__ import annotations

import asyncio
import getpass
import importlib
import json
import logging
import os
import re
import shlex
import sys
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar, cast

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ledgerq import __version__
from ledgerq.errors import DatabaseError, DatabaseUnavailable
from ledgerq.projections.read_models import fact_count, run_status
from ledgerq.queue import DEFAULT_HEARTBEAT_TTL_SECONDS, runtime
from ledgerq.queue.application import check_text

if TYPE_CHECKING:
    from ledgerq.lifecycle.registry import Registry
    from ledgerq.store.db import StateDB, Synchronous

T = TypeVar("T")

DEFAULT_DB = "ledgerq.db"
DB_ENV = "LEDGERQ_DB"
SPECS_ENV = "LEDGERQ_SPECS"
SYNC_ENV = "LEDGERQ_SYNCHRONOUS"
RUN_ENTITY = "schedule_run"
#: Exit codes.
OK, DOMAIN_FAILURE, USAGE_ERROR = 0, 1, 2

app = typer.Typer(
    name="ledgerq",
    help="Event-sourced lifecycles with a durable task queue: submit, watch, cancel, "
         "verify and run workers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
specs_app = typer.Typer(help="Validate, draw and document the lifecycle spec files.",
                        no_args_is_help=True)
app.add_typer(specs_app, name="specs")

#: Off a terminal rich assumes 80 columns and squeezes tables; give them room instead.
_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200
#: emoji=False: a stored ":smile:" is shown as typed (values go in as Text, never markup).
out = Console(highlight=False, width=_WIDTH, emoji=False)
err_console = Console(stderr=True, highlight=False, emoji=False)

STATUS_STYLE = {
    "queued": "blue", "waiting_dependency": "magenta", "running": "cyan",
    "retry_wait": "yellow", "completed": "green", "failed": "red", "timed_out": "red",
    "skipped": "dim", "cancelled": "yellow",
}


# ------------------------------------------------------------------ plumbing


#: What a terminal may act on instead of showing: C0 controls (ESC starts a sequence that
#: can clear the screen or retitle the window), DEL, C1 controls (CSI and OSC alone), the
#: bidirectional overrides and isolates that reorder what is shown, line/paragraph
#: separators, and lone surrogates (undecodable bytes; stdout cannot even encode them).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                     "\u2066-\u2069\ud800-\udfff]")


def _escape_char(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: object) -> str:
    """``value`` as text a terminal shows literally: every unsafe character as ``\\xNN``.

    Every human-readable output runs what came from the database or a user (ids, kinds,
    args, error details, reason summaries, actors, worker ids, spec problems) through
    this one function; ``--json`` output keeps the exact strings (JSON escapes them).
    """
    return _UNSAFE.sub(_escape_char, value if isinstance(value, str) else str(value))


def cell(value: object, style: str = "") -> Text:
    """A value for a rich table or print: escaped, and a Text, so "[red]" is never markup."""
    return Text(printable(value), style=style)


def report(message: str) -> None:
    """The one error line: whitespace runs collapsed, unsafe characters escaped."""
    line = printable(" ".join(str(message).split()))
    sys.stderr.write(f"ledgerq: error: {line}\n")
    sys.stderr.flush()


def die(message: str, code: int = USAGE_ERROR) -> NoReturn:
    """One line on stderr, then exit with ``code``."""
    report(message)
    raise typer.Exit(code)


def text_option(value: str, option: str) -> str:
    """A value that is stored as text (and so must be UTF-8), or a usage error naming it."""
    try:
        check_text(value, option)
    except ValueError as exc:
        die(str(exc))
    return value


#: SQLite's words for a file whose pages are not what it wrote.
_DAMAGE_WORDS = ("malformed", "not a database", "corrupt")


def database_message(exc: BaseException, path: Path | str | None = None) -> str:
    """The one line for a database failure: ``database is damaged: <file>: ...`` for damage.

    The library's own errors (DatabaseDamaged, SchemaMissing, ...) already name the file;
    a bare sqlite3 error gets the path put in front.
    """
    if isinstance(exc, DatabaseError):
        return str(exc) or type(exc).__name__
    text = str(exc) or type(exc).__name__
    where = f"{path}: " if path is not None else ""
    if any(word in text.lower() for word in _DAMAGE_WORDS):
        return f"database is damaged: {where}{text}"
    return f"database error: {where}{text}"


def emit_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")


#: aiosqlite names each connection's thread after its target function.
_DB_THREAD_SUFFIX = "(_connection_worker_thread)"
#: Bounds the wait for those threads (each needs one loop turn to finish; a live
#: connection never would, and must not hang the exit).
_DB_THREAD_GRACE = 5.0


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run``, but the loop closes only after aiosqlite's threads have finished.

    A connection that fails to open (``--db`` under a missing directory) leaves its
    thread to post one last result to the loop; when ``die()`` ended the loop first,
    that thread died with a 24-line "Event loop is closed" traceback after our one line.
    """

    async def settled() -> T:
        before = set(threading.enumerate())
        try:
            return await coro
        finally:
            deadline = time.monotonic() + _DB_THREAD_GRACE
            for thread in set(threading.enumerate()) - before:
                if not thread.name.endswith(_DB_THREAD_SUFFIX):
                    continue
                while thread.is_alive() and time.monotonic() < deadline:
                    await asyncio.sleep(0.005)

    return asyncio.run(settled())


#: Run ids are time-ordered (UUIDv7): the random part, and so the easy short piece, is the tail.
ID_HELP = "Run id, or a unique prefix or suffix of 4+ characters."
DbOption = Annotated[
    str | None,
    typer.Option("--db", help=f"Database: a SQLite file, or a postgresql:// URL (env {DB_ENV}; "
                 f"default ./{DEFAULT_DB}).", show_default=False),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def db_path(ctx: typer.Context, db: str | None) -> str:
    """--db on the command, else --db before it, else $LEDGERQ_DB, else ./ledgerq.db."""
    if db is not None:
        return db
    root = ctx.find_root().obj
    if isinstance(root, dict) and root.get("db") is not None:
        return str(root["db"])
    return os.environ.get(DB_ENV) or DEFAULT_DB


def root_specs(ctx: typer.Context) -> Path | None:
    """The spec directory given before the command (``ledgerq --specs DIR ...``), if any."""
    root = ctx.find_root().obj
    specs = root.get("specs") if isinstance(root, dict) else None
    return Path(specs) if specs is not None else None


@asynccontextmanager
async def open_db(ctx: typer.Context, path: str, *, must_exist: bool = True,
                  readonly: bool = False) -> AsyncIterator[StateDB]:
    """Open the database with the root options: the spec directory and ``--synchronous``.

    Read commands pass ``readonly=True``: the file is opened read-only and never written
    (no schema, no WAL switch), so a user who may only read it can still run them.
    Every database failure of a command ends here as one line: a path SQLite cannot open
    is a usage error (exit 2); a damaged file, one without ledgerq's schema, or anything
    failing after the open is a database failure (exit 1). Never a traceback.
    """
    from ledgerq.store.db import StateDB, is_postgres

    if must_exist and not is_postgres(path) and path != ":memory:" and not Path(path).exists():
        die(f"no database at {path} (pass --db or set {DB_ENV}; submit and worker create one)")
    specs = root_specs(ctx)
    registry = load_specs(specs) if specs is not None else None
    root = ctx.find_root().obj
    synchronous = (root.get("synchronous") if isinstance(root, dict) else None) or "NORMAL"
    try:
        # StateDB checks the value (any case) and names the accepted ones if it is wrong.
        db = StateDB(path, registry=registry, synchronous=cast("Synchronous", synchronous),
                     readonly=readonly)
    except ValueError as exc:
        die(f"--synchronous: {exc}")
    try:
        await db.open()
    except DatabaseUnavailable as exc:
        die(f"cannot open database {exc}")
    except DatabaseError as exc:
        die(database_message(exc, path), DOMAIN_FAILURE)
    failure: BaseException | None = None
    try:
        yield db
    except DatabaseError as exc:
        failure = exc
    finally:
        try:
            await db.close()
        except DatabaseError as exc:
            failure = failure or exc
    if failure is not None:
        die(database_message(failure, path), DOMAIN_FAILURE)


def fmt_ts(ts: float | None) -> str:
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def fmt_age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    return f"{hours // 24}d {hours % 24}h"


def styled_status(status: str | None) -> Text:
    return cell(status or "", STATUS_STYLE.get(status or "", ""))


def current_user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "operator"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"ledgerq {__version__}")
        raise typer.Exit(OK)


@app.callback()
def root(
    ctx: typer.Context,
    db: DbOption = None,
    specs: Annotated[Path | None, typer.Option(
        "--specs", envvar=SPECS_ENV, exists=True,
        help=f"Spec directory the database commands use (env {SPECS_ENV}; default: the "
             "packaged specs).", show_default=False)] = None,
    synchronous: Annotated[str | None, typer.Option(
        "--synchronous", envvar=SYNC_ENV, metavar="NORMAL|FULL",
        help=f"SQLite durability of every commit (env {SYNC_ENV}; default NORMAL). NORMAL "
             "survives a killed process; FULL also survives power loss, one fsync per "
             "commit. EXTRA and OFF are accepted too.", show_default=False)] = None,
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.",
                                          is_eager=True, callback=_print_version)] = False,
) -> None:
    """ledgerq: every status change is a guarded fact in an append-only log."""
    ctx.obj = {"db": db, "specs": specs, "synchronous": synchronous}


# ------------------------------------------------------------------ submit


def parse_json(raw: str, option: str) -> Any:
    """JSON from an option, or one usage error naming the option.

    The parser recurses: JSON nested thousands of levels deep raised a bare
    RecursionError traceback before the application's depth limit could refuse it.
    """
    from ledgerq.queue.application import MAX_ARGS_DEPTH

    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        die(f"{option} is not valid JSON: {exc}")
    except RecursionError:
        die(f"{option} is nested too deeply to parse (args may be nested at most "
            f"{MAX_ARGS_DEPTH} levels)")


def parse_arg(item: str) -> tuple[str, Any]:
    """``key=value`` (a string) or ``key:=JSON`` (any JSON value)."""
    eq = item.find("=")
    if eq <= 0:
        die(f"--arg {item!r}: expected key=value or key:=JSON")
    if item[eq - 1] == ":":
        key, raw = item[:eq - 1], item[eq + 1:]
        if not key:
            die(f"--arg {item!r}: expected key=value or key:=JSON")
        return key, parse_json(raw, f"--arg {key}:=")
    return item[:eq], item[eq + 1:]


def build_args(args_json: str | None, pairs: list[str], argv: list[str] | None) -> dict[str, Any]:
    args: dict[str, Any] = {}
    if args_json is not None:
        parsed = parse_json(args_json, "--args")
        if not isinstance(parsed, dict):
            die(f"--args must be a JSON object, got {type(parsed).__name__}")
        args.update(parsed)
    for item in pairs:
        key, value = parse_arg(item)
        args[key] = value
    if argv is not None:
        if "argv" in args:
            die("argv given twice: in --args/--arg and as --argv or trailing arguments")
        args["argv"] = argv
    return args


@app.command()
def submit(
    ctx: typer.Context,
    kind: Annotated[str, typer.Argument(
        help="Action kind: agent, flow, fanout, play (alias playbook), flow_yaml, engine, "
             "workflow or command.", show_default=False, metavar="KIND")],
    command: Annotated[list[str] | None, typer.Argument(
        help="command tasks: the argv to run, after `--` (never run through a shell).",
        show_default=False, metavar="ARGV")] = None,
    target: Annotated[str, typer.Option(
        "--target", "-t", help="Execution target: host, local_worktree, daytona, "
                               "remote_agent or process.")] = "host",
    arg: Annotated[list[str] | None, typer.Option(
        "--arg", "-a", help="One argument: key=value (a string) or key:=JSON. Repeatable.",
        show_default=False)] = None,
    args_json: Annotated[str | None, typer.Option(
        "--args", help="All arguments as one JSON object (--arg entries override).",
        show_default=False)] = None,
    argv: Annotated[str | None, typer.Option(
        "--argv", help="command tasks: the argv as one string, split like a shell would "
                       "(shlex) but never run by one.", show_default=False)] = None,
    cap: Annotated[list[str] | None, typer.Option(
        "--cap", help="A required capability token. Repeatable.", show_default=False)] = None,
    library_ref: Annotated[str | None, typer.Option(
        "--library-ref", help="Provenance: library reference, stored verbatim.",
        show_default=False)] = None,
    library_hash: Annotated[str | None, typer.Option(
        "--library-hash", help="Provenance: library content hash, stored verbatim.",
        show_default=False)] = None,
    idempotency_key: Annotated[str | None, typer.Option(
        "--idempotency-key", help="Repeat-safe key: the same key and application return "
                                  "the first run's id.", show_default=False)] = None,
    retry_max: Annotated[int | None, typer.Option(
        "--retry-max", help="Retry policy: attempts in total, the first run included.",
        show_default=False)] = None,
    retry_delay: Annotated[float | None, typer.Option(
        "--retry-delay", help="Retry policy: seconds before the first retry (default 1).",
        show_default=False)] = None,
    retry_factor: Annotated[float | None, typer.Option(
        "--retry-factor", help="Retry policy: backoff multiplier (default 2).",
        show_default=False)] = None,
    retry_max_delay: Annotated[float | None, typer.Option(
        "--retry-max-delay", help="Retry policy: longest delay in seconds (default 3600).",
        show_default=False)] = None,
    retry_jitter: Annotated[float | None, typer.Option(
        "--retry-jitter", help="Retry policy: ± spread as a fraction (default 0.1).",
        show_default=False)] = None,
    timeout: Annotated[float | None, typer.Option(
        "--timeout", help="Seconds the run may execute before it is killed (timed_out).",
        show_default=False)] = None,
    depends_on: Annotated[list[str] | None, typer.Option(
        "--depends-on", help="A run id that must complete first. Repeatable.",
        show_default=False)] = None,
    db: DbOption = None,
    json_out: JsonOption = False,
) -> None:
    """Submit one task; prints its run id. Validated exactly like submit_task()."""
    from ledgerq.queue.application import RetryPolicy, TaskApplication, validate

    if command and argv is not None:
        die("give the argv either as --argv or after `--`, not both")
    argv_list: list[str] | None = list(command) if command else None
    if argv is not None:
        try:
            argv_list = shlex.split(argv)
        except ValueError as exc:
            die(f"--argv cannot be split: {exc}")
    if argv_list is not None and kind != "command":
        die(f"an argv is only for command tasks, not {kind!r}; use --arg/--args")
    args = build_args(args_json, arg or [], argv_list)
    retry = None
    extras = {"--retry-delay": retry_delay, "--retry-factor": retry_factor,
              "--retry-max-delay": retry_max_delay, "--retry-jitter": retry_jitter}
    if retry_max is None:
        given = [name for name, value in extras.items() if value is not None]
        if given:
            die(f"{given[0]} needs --retry-max")
    else:
        fields: dict[str, Any] = {"max_attempts": retry_max,
                                  "base_delay": 1.0 if retry_delay is None else retry_delay}
        for name, value in (("factor", retry_factor), ("max_delay", retry_max_delay),
                            ("jitter", retry_jitter)):
            if value is not None:
                fields[name] = value
        try:
            retry = RetryPolicy(**fields)
        except ValueError as exc:
            die(str(exc))
    application = TaskApplication(
        action_kind=kind, args=args, execution_target=target,
        required_capabilities=list(cap or []), library_ref=library_ref,
        library_content_hash=library_hash, idempotency_key=idempotency_key, retry=retry,
        timeout_seconds=timeout, depends_on=tuple(depends_on or ()),
    )
    try:
        validate(application)
    except (ValueError, TypeError) as exc:
        die(str(exc))
    path = db_path(ctx, db)

    async def go() -> tuple[str, str]:
        from ledgerq.queue.submit import submit_task

        async with open_db(ctx, path, must_exist=False) as handle:
            try:
                run_id = await submit_task(handle, application)
            except ValueError as exc:
                die(str(exc))
            return run_id, await run_status(handle, run_id) or ""

    run_id, status = run(go())
    if json_out:
        emit_json({"id": run_id, "status": status})
    else:
        typer.echo(printable(run_id))


# ------------------------------------------------------------------ ls / show / cancel


def _check_choice(what: str, values: list[str], allowed: list[str]) -> None:
    for v in values:
        if v not in allowed:
            die(f"unknown {what} {v!r}; expected one of {', '.join(allowed)}")


@app.command("ls")
def ls(
    ctx: typer.Context,
    status: Annotated[list[str] | None, typer.Option(
        "--status", "-s", help="Only runs in this status. Repeatable.",
        show_default=False)] = None,
    kind: Annotated[list[str] | None, typer.Option(
        "--kind", "-k", help="Only runs of this action kind. Repeatable.",
        show_default=False)] = None,
    target: Annotated[list[str] | None, typer.Option(
        "--target", "-t", help="Only runs for this execution target. Repeatable.",
        show_default=False)] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=0, help="Page size.")] = 50,
    offset: Annotated[int, typer.Option("--offset", min=0, help="Runs to skip.")] = 0,
    db: DbOption = None,
    json_out: JsonOption = False,
) -> None:
    """List runs, newest first."""
    from ledgerq.projections.read_models import SUMMARY_COLUMNS, list_runs
    from ledgerq.queue.application import ACTION_ALIASES, ACTION_KINDS, EXECUTION_TARGETS

    statuses = list(status or [])
    _check_choice("status", statuses, list(load_specs(root_specs(ctx)).entity(RUN_ENTITY).states))
    kinds = [ACTION_ALIASES.get(k, k) for k in kind or []]
    _check_choice("action kind", kinds, list(ACTION_KINDS))
    targets = list(target or [])
    _check_choice("execution target", targets, sorted(EXECUTION_TARGETS))
    path = db_path(ctx, db)

    async def go() -> Any:
        async with open_db(ctx, path, readonly=True) as handle:
            return await list_runs(handle, statuses=statuses, kinds=kinds, targets=targets,
                                   limit=limit, offset=offset)

    page = run(go())
    if json_out:
        emit_json({"runs": page.runs, "total": page.total, "limit": page.limit,
                   "offset": page.offset, "columns": list(SUMMARY_COLUMNS)})
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("ID", no_wrap=True, min_width=36)
    for name in ("STATUS", "KIND", "TARGET", "CREATED", "EXIT", "WORKER", "REASON"):
        table.add_column(name)
    for r in page.runs:
        table.add_row(cell(r["id"]), styled_status(r["status"]), cell(r["action_kind"]),
                      cell(r["execution_target"] or ""), fmt_ts(r["created_at"]),
                      "" if r["exit_code"] is None else cell(r["exit_code"]),
                      cell(r["leased_by"] or ""), cell(r["status_reason_code"] or ""))
    out.print(table)
    shown = len(page.runs)
    first = page.offset + 1 if shown else page.offset
    more = (f"; --offset {page.offset + shown} for more"
            if page.offset + shown < page.total else "")
    err_console.print(f"[dim]{first}-{page.offset + shown} of {page.total} run(s), "
                      f"newest first{more}[/dim]")


async def _resolve(handle: StateDB, run_id: str) -> str:
    from ledgerq.projections.read_models import resolve_run_id

    text_option(run_id, "ID")
    try:
        return await resolve_run_id(handle, run_id)
    except LookupError as exc:
        die(str(exc).strip("'\""), DOMAIN_FAILURE)
    except ValueError as exc:
        die(str(exc))


@app.command()
def show(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help=ID_HELP,
                                          show_default=False, metavar="ID")],
    db: DbOption = None,
    json_out: JsonOption = False,
) -> None:
    """Show one run: its row and its full fact history."""
    from ledgerq.projections.read_models import get_run, run_history

    path = db_path(ctx, db)

    async def go() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        async with open_db(ctx, path, readonly=True) as handle:
            full = await _resolve(handle, run_id)
            return await get_run(handle, full), await run_history(handle, full)

    row, facts = run(go())
    if json_out:
        emit_json({"run": row, "history": facts})
        return
    head = Table(box=None, show_header=False, pad_edge=False)
    head.add_column(style="bold", no_wrap=True)
    head.add_column()
    for col, value in row.items():
        if value is None or value == "" or value == [] or value == {}:
            continue
        if col.endswith("_at") and isinstance(value, int | float):
            shown: Text = cell(f"{fmt_ts(value)}  ({value:.3f})")
        elif col == "status":
            shown = styled_status(value)
        elif isinstance(value, dict | list):
            # ensure_ascii=False: a non-ASCII argument reads as itself; printable() then
            # escapes only what a terminal would act on.
            shown = cell(json.dumps(value, sort_keys=True, ensure_ascii=False))
        else:
            shown = cell(value)
        head.add_row(cell(col), shown)
    out.print(head)
    out.print()
    hist = Table(title=f"history ({len(facts)} facts)", title_justify="left",
                 header_style="bold", box=None, pad_edge=False)
    for name in ("V", "AT", "FROM", "TO", "REASON", "ACTOR", "SUMMARY"):
        hist.add_column(name)
    for f in facts:
        hist.add_row(cell(f["entity_version"]), fmt_ts(f["created_at"]),
                     cell(f["previous_status"] or "(created)"), styled_status(f["status"]),
                     cell(f["reason_code"]), cell(f"{f['source']}:{f['actor']}"),
                     cell(f["reason_summary"] or ""))
    out.print(hist)


@app.command()
def cancel(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help=ID_HELP,
                                          show_default=False, metavar="ID")],
    actor: Annotated[str | None, typer.Option(
        "--actor", help="Operator id recorded on the fact (default: your user name).",
        show_default=False)] = None,
    reason: Annotated[str, typer.Option("--reason", help="Summary recorded on the fact.")] = "",
    db: DbOption = None,
    json_out: JsonOption = False,
) -> None:
    """Cancel a run that has not ended (a running one is stopped by its worker).

    Exit 1 when it had already ended: the cancel is a conflict and writes nothing.
    """
    from ledgerq.lifecycle.models import Actor
    from ledgerq.queue.submit import cancel_task

    path = db_path(ctx, db)
    # The actor and the summary are stored on the fact: text the database can hold.
    who = Actor(type="operator", id=text_option(actor, "--actor") if actor
                else text_option(current_user(), "the user name (LOGNAME/USER)"))
    text_option(reason, "--reason")

    async def go() -> tuple[str, str, bool, str]:
        async with open_db(ctx, path) as handle:
            full = await _resolve(handle, run_id)
            before = await run_status(handle, full) or ""
            try:
                done = await cancel_task(handle, full, actor=who, summary=reason)
            except LookupError as exc:
                die(str(exc), DOMAIN_FAILURE)
            after = await run_status(handle, full) or ""
            return full, before, done, after

    full, before, done, after = run(go())
    if json_out:
        emit_json({"id": full, "cancelled": done, "previous_status": before, "status": after})
    if not done:
        die(f"run {full} already ended ({after}); nothing cancelled", DOMAIN_FAILURE)
    if not json_out:
        typer.echo(printable(f"cancelled {full} (was {before})"))


# ------------------------------------------------------------------ worker


@app.command()
def worker(
    ctx: typer.Context,
    capacity: Annotated[int, typer.Option("--capacity", "-c", min=1,
                                          help="Runs executed at once.")
    ] = runtime.DEFAULT_CAPACITY,
    cap: Annotated[list[str] | None, typer.Option(
        "--cap", help="An advertised capability token. Repeatable.",
        show_default=False)] = None,
    target: Annotated[list[str] | None, typer.Option(
        "--target", "-t", help="An execution target served. Repeatable (default: host).",
        show_default=False)] = None,
    poll_interval: Annotated[float, typer.Option(
        "--poll-interval", min=0.001, help="Seconds between claim passes when idle.")
    ] = runtime.DEFAULT_POLL_INTERVAL,
    lease_ttl: Annotated[float, typer.Option(
        "--lease-ttl", min=0.1, help="Lease length in seconds; renewed every third.")
    ] = runtime.DEFAULT_WORKER_LEASE_TTL,
    heartbeat_ttl: Annotated[float, typer.Option(
        "--heartbeat-ttl", min=0.1, help="A worker silent this long claims nothing.")
    ] = DEFAULT_HEARTBEAT_TTL_SECONDS,
    shutdown_grace: Annotated[float, typer.Option(
        "--shutdown-grace", min=0.0,
        help="On SIGINT/SIGTERM, seconds running runs get before being requeued.")
    ] = runtime.DEFAULT_SHUTDOWN_GRACE,
    worker_id: Annotated[str | None, typer.Option(
        "--worker-id", help="Worker id (default: host:<8 hex>).", show_default=False)] = None,
    lock_dir: Annotated[Path | None, typer.Option(
        "--lock-dir", help="Directory of the per-concurrency-key OS lock files "
                           "(default: <tmp>/ledgerq-locks).",
        show_default=False, file_okay=False)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q",
                                        help="No per-run lines on stderr.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v",
                                          help="Log the worker's INFO messages.")] = False,
    db: DbOption = None,
) -> None:
    """Run a worker until SIGINT/SIGTERM: claim, execute, renew leases, reap, retry.

    On a signal it stops claiming, lets running runs finish within --shutdown-grace,
    then stops their process groups and requeues them.
    """
    from ledgerq.queue.application import EXECUTION_TARGETS

    targets = list(target or ["host"])
    _check_choice("execution target", targets, sorted(EXECUTION_TARGETS))
    # Both are stored (the workers table, every fact the worker writes): UTF-8 text only.
    if worker_id is not None:
        text_option(worker_id, "--worker-id")
    for i, token in enumerate(cap or []):
        text_option(token, f"--cap[{i}]")
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    path = db_path(ctx, db)

    async def go() -> None:
        from ledgerq.queue.launcher import default_execute
        from ledgerq.queue.runtime import DEFAULT_LOCK_DIR, Worker

        async with open_db(ctx, path, must_exist=False) as handle:
            holder: dict[str, str] = {}

            def say(text: str) -> None:
                if not quiet:
                    stamp = datetime.now().strftime("%H:%M:%S.%f")[:-3]
                    sys.stderr.write(printable(f"{stamp} {holder.get('id', '')} {text}") + "\n")
                    sys.stderr.flush()

            async def execute(row: dict[str, Any]) -> tuple[int, str]:
                start = time.monotonic()
                say(f"run {row['id']} start {row['action_kind']}")
                try:
                    code, detail = await default_execute(row)
                except asyncio.CancelledError:
                    say(f"run {row['id']} stopped after {time.monotonic() - start:.2f}s")
                    raise
                say(f"run {row['id']} exit {code} after {time.monotonic() - start:.2f}s")
                return code, detail

            w = Worker(handle, worker_id=worker_id, capacity=capacity,
                       poll_interval=poll_interval, lease_ttl=lease_ttl,
                       heartbeat_ttl=heartbeat_ttl, advertised_capabilities=list(cap or []),
                       execution_targets=targets, execute=execute,
                       lock_dir=lock_dir if lock_dir is not None else DEFAULT_LOCK_DIR,
                       shutdown_grace=shutdown_grace)
            holder["id"] = w.worker_id
            # What the connection really runs with, read back: a durability setting that
            # did not take must not be announced as if it had.
            durability = await handle.durability()
            sys.stderr.write(printable(
                f"ledgerq worker {w.worker_id} (pid {os.getpid()}): capacity {capacity}, "
                f"targets {','.join(targets)}, capabilities {','.join(cap or []) or '-'}, "
                f"lease {lease_ttl:g}s, {durability}, "
                f"db {path}") + "\n")
            sys.stderr.flush()
            await w.run()
            summary = ", ".join(f"{n} {k}" for k, n in sorted(w.outcomes.items())) or "no runs"
            sys.stderr.write(printable(f"ledgerq worker {w.worker_id} stopped: {summary}")
                             + "\n")

    from ledgerq.errors import DatabaseError

    try:
        run(go())
    except ValueError as exc:
        die(str(exc))
    except DatabaseError as exc:  # the file was deleted, replaced or damaged under it
        die(str(exc), DOMAIN_FAILURE)


# ------------------------------------------------------------------ verify / rebuild / stats


def drift_dict(d: Any) -> dict[str, Any]:
    return {"entity_type": d.entity_type, "entity_id": d.entity_id, "problem": d.problem,
            "column": d.column, "expected": d.expected, "actual": d.actual,
            "message": str(d)}


@app.command()
def verify(ctx: typer.Context, db: DbOption = None, json_out: JsonOption = False) -> None:
    """Fold every entity's facts and compare with its row; exit 1 on any drift."""
    from ledgerq.projections.log import verify as verify_db

    path = db_path(ctx, db)

    async def go() -> Any:
        async with open_db(ctx, path, readonly=True) as handle:
            if json_out or not err_console.is_terminal:
                return await verify_db(handle)
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            facts = await fact_count(handle)
            with Progress(TextColumn("verifying"), BarColumn(),
                          TextColumn("{task.completed}/{task.total} facts"),
                          TimeElapsedColumn(), console=err_console, transient=True) as bar:
                task = bar.add_task("verify", total=facts)
                return await verify_db(handle, progress=lambda n: bar.update(
                    task, completed=n))

    report = run(go())
    if json_out:
        emit_json({"ok": report.ok, "rows": report.rows, "facts": report.facts,
                   "drift": [drift_dict(d) for d in report.drift]})
    elif report.ok:
        out.print(f"[green]ok[/green]: {report.rows} rows agree with {report.facts} facts; "
                  "no drift")
    else:
        for d in report.drift:
            typer.echo(printable(f"drift: {d}"))
    if not report.ok:
        if not json_out:
            sys.stderr.write(f"ledgerq: error: {len(report.drift)} drift finding(s) in "
                             f"{path}; `ledgerq rebuild` recreates rows from the log\n")
        raise typer.Exit(DOMAIN_FAILURE)


@app.command()
def rebuild(ctx: typer.Context, db: DbOption = None, json_out: JsonOption = False) -> None:
    """Recreate every projection row from the fact log alone (one transaction), then verify."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ledgerq.projections.log import rebuild as rebuild_db
    from ledgerq.projections.log import verify as verify_db

    path = db_path(ctx, db)

    async def go() -> tuple[Any, Any]:
        async with open_db(ctx, path) as handle:
            facts = await fact_count(handle)
            with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                          TextColumn("{task.completed}/{task.total} facts"),
                          TimeElapsedColumn(), console=err_console,
                          # A bar only for a person watching: piped or captured stderr
                          # would otherwise get its last frame as a stray line.
                          disable=json_out or not err_console.is_terminal) as progress:
                task = progress.add_task("folding the log into projections", total=facts)
                report = await rebuild_db(handle, progress=lambda n: progress.update(
                    task, completed=n))
                progress.update(task, completed=report.facts,
                                description="rebuilt (one transaction)")
                check = progress.add_task("verifying", total=report.facts)
                checked = await verify_db(handle, progress=lambda n: progress.update(
                    check, completed=n))
                progress.update(check, completed=report.facts, description="verified")
            return report, checked

    report, checked = run(go())
    if json_out:
        emit_json({"rows": report.rows, "facts": report.facts, "tables": report.tables,
                   "verify_ok": checked.ok})
    else:
        tables = ", ".join(f"{t} {n}" for t, n in report.tables.items())
        out.print(f"rebuilt {report.rows} rows from {report.facts} facts ({tables}); "
                  f"verify: {'[green]clean[/green]' if checked.ok else '[red]drift[/red]'}")
    if not checked.ok:
        raise typer.Exit(DOMAIN_FAILURE)


@app.command()
def stats(ctx: typer.Context, db: DbOption = None, json_out: JsonOption = False) -> None:
    """Counts per status, the oldest queued run's age, and what each worker is running."""
    from ledgerq.projections.read_models import queue_stats

    path = db_path(ctx, db)

    async def go() -> Any:
        async with open_db(ctx, path, readonly=True) as handle:
            return await queue_stats(handle)

    s = run(go())
    if json_out:
        emit_json(s.to_dict())
        return
    counts = Table(box=None, header_style="bold", pad_edge=False)
    counts.add_column("STATUS")
    counts.add_column("RUNS", justify="right")
    for status, n in s.counts.items():
        counts.add_row(styled_status(status), cell(n))
    counts.add_row(Text("total", style="bold"), Text(str(s.total), style="bold"))
    out.print(counts)
    out.print(f"\noldest queued: {fmt_age(s.oldest_queued_age_seconds)}"
              + (f" (since {fmt_ts(s.oldest_queued_at)})" if s.oldest_queued_at else ""))
    out.print(cell(f"stuck: {s.stuck}"))
    for r in s.stuck_runs:
        out.print(cell(f"  {r.id} {r.status}: {r.why}"))
    if s.workers or s.running_by_worker:
        wt = Table(box=None, header_style="bold", pad_edge=False, title="workers",
                   title_justify="left")
        for name in ("WORKER", "HOST", "PID", "HEARTBEAT", "RUNNING"):
            wt.add_column(name)
        seen = set()
        for w in s.workers:
            seen.add(w.worker_id)
            wt.add_row(cell(w.worker_id), cell(w.hostname or ""), cell(w.pid or ""),
                       f"{fmt_age(w.heartbeat_age_seconds)} ago", cell(w.running))
        for wid, n in s.running_by_worker.items():
            if wid not in seen:
                wt.add_row(cell(wid), "", "", "never", cell(n))
        out.print()
        out.print(wt)


# ------------------------------------------------------------------ specs


_AT_PATH = re.compile(r" - at `(\$[^`]*)`$")


def split_problem(problem: str, files: list[str]) -> dict[str, str]:
    """``file: $.path: message`` (or msgspec's ``message - at `$.path```) as a dict."""
    file = next((f for f in sorted(files, key=len, reverse=True)
                 if problem.startswith(f + ": ")), None)
    if file is None:
        file, _, rest = problem.partition(": ")
    else:
        rest = problem[len(file) + 2:]
    if rest.startswith("$"):
        path, _, message = rest.partition(": ")
    elif (m := _AT_PATH.search(rest)) is not None:
        path, message = m.group(1), rest[:m.start()]
    else:
        path, message = "$", rest
    return {"file": file, "path": path, "message": message}


def load_specs(specs: Path | None) -> Registry:
    from ledgerq.lifecycle.registry import default_registry, load_registry
    from ledgerq.lifecycle.spec import SpecError

    if specs is None:
        return default_registry()
    try:
        return load_registry(specs)
    except SpecError as exc:
        die(f"{specs} is not a valid spec set ({len(exc.problems)} problem(s)); "
            f"run `ledgerq specs check {specs}`", DOMAIN_FAILURE)


SpecsOption = Annotated[
    Path | None,
    typer.Option("--specs", help="Spec directory (or file) (default: the packaged specs).",
                 show_default=False, exists=True),
]


@specs_app.command("check")
def specs_check(
    ctx: typer.Context,
    directory: Annotated[Path | None, typer.Argument(
        help="Spec directory or file (default: the packaged specs).", show_default=False,
        exists=True, metavar="DIR")] = None,
    json_out: JsonOption = False,
) -> None:
    """Validate spec files; every problem on its own line as FILE: $.PATH: MESSAGE (exit 1)."""
    from ledgerq.lifecycle.registry import load_registry, packaged_specs_dir
    from ledgerq.lifecycle.spec import SpecError

    root = directory or root_specs(ctx) or packaged_specs_dir()
    files = [str(root)] if root.is_file() else [str(f) for f in sorted(root.glob("*.toml"))]
    try:
        registry = load_registry(root)
    except SpecError as exc:
        problems = [split_problem(p, files) for p in exc.problems]
        if json_out:
            emit_json({"ok": False, "dir": str(root), "files": files, "entities": [],
                       "problems": problems})
        else:
            for p in problems:
                typer.echo(printable(f"{p['file']}: {p['path']}: {p['message']}"))
            sys.stderr.write(f"ledgerq: error: {len(problems)} problem(s) in {root}\n")
        raise typer.Exit(DOMAIN_FAILURE) from None
    if json_out:
        emit_json({"ok": True, "dir": str(root), "files": files,
                   "entities": sorted(registry.entities), "problems": []})
    else:
        names = ", ".join(sorted(registry.entities))
        typer.echo(f"ok: {len(files)} file(s), {len(registry.entities)} entities ({names}) "
                   f"in {root}")


@specs_app.command("graph")
def specs_graph(
    ctx: typer.Context,
    entity: Annotated[str, typer.Argument(help="Entity name, e.g. schedule_run.",
                                          show_default=False, metavar="ENTITY")],
    specs: SpecsOption = None,
    json_out: JsonOption = False,
) -> None:
    """Print an entity's lifecycle as a mermaid stateDiagram."""
    from ledgerq.lifecycle.docs import ordered_edges

    registry = load_specs(specs or root_specs(ctx))
    try:
        policy = registry.entity(entity)
    except ValueError as exc:
        die(str(exc))
    if json_out:
        emit_json({
            "entity": policy.name, "table": policy.table, "states": list(policy.states),
            "initial": sorted(policy.initial), "terminal": sorted(policy.terminal),
            "edges": [{"from": a, "to": b} for a, b in ordered_edges(policy)],
            "mermaid": policy.mermaid(),
        })
    else:
        sys.stdout.write(policy.mermaid())


@specs_app.command("docs")
def specs_docs(
    ctx: typer.Context,
    out_dir: Annotated[Path, typer.Option("--out", help="Where the pages go.",
                                          file_okay=False)] = Path("docs/lifecycles"),
    specs: SpecsOption = None,
    check: Annotated[bool, typer.Option(
        "--check", help="Write nothing; exit 1 if any page is missing or stale.")] = False,
) -> None:
    """Generate <entity>.md per entity: mermaid diagram, states, edges, reason codes."""
    from ledgerq.lifecycle.docs import render_all, stale_pages

    registry = load_specs(specs or root_specs(ctx))
    if check:
        stale = stale_pages(registry, out_dir)
        for name in stale:
            typer.echo(f"stale: {out_dir / name}")
        if stale:
            die(f"{len(stale)} lifecycle page(s) out of date; run `ledgerq specs docs "
                f"--out {out_dir}`", DOMAIN_FAILURE)
        typer.echo(f"ok: {len(registry.entities)} page(s) in {out_dir} are up to date")
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in render_all(registry).items():
        target = out_dir / name
        changed = not target.is_file() or target.read_text(encoding="utf-8") != text
        if changed:
            target.write_text(text, encoding="utf-8")
        typer.echo(f"{'wrote' if changed else 'unchanged'} {target}")


# ------------------------------------------------------------------ demo


@app.command()
def demo(
    db: Annotated[Path | None, typer.Option(
        "--db", help="Where the demo database goes; must not exist yet. Worker logs go to "
                     "<db>.demo/ beside it (default: a new temporary directory for both).",
        show_default=False, dir_okay=False)] = None,
) -> None:
    """Run a two-worker demonstration on a fresh SQLite file, killing one worker mid-run.

    Submits real command tasks (successes, a failure, a dependency, a cancel, a retry,
    a timeout), runs two worker processes, SIGKILLs one while it runs a long task, and
    shows the lease recovery, the per-status counts and a clean verify().
    """
    from ledgerq.demo import run_demo

    if db is not None and db.exists():
        die(f"{db} already exists; the demo needs a fresh database")
    raise typer.Exit(run(run_demo(db, out)))


def _click_exceptions() -> Any:
    """click's exception module: typer >= 0.2x vendors click as ``typer._click``; older
    typers (``typer>=0.12`` is allowed) depend on click itself."""
    try:
        return importlib.import_module("typer._click.exceptions")
    except ImportError:  # pragma: no cover - depends on the installed typer
        return importlib.import_module("click.exceptions")


def usage_message(exc: Any) -> str:
    """click's usage error as our one line: the message, then where the help is."""
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "ledgerq"
    return f"{exc.format_message()} (see '{command} --help')"


def run_cli(args: Sequence[str] | None = None) -> int:
    """Run the command line and return its exit code; errors are one stderr line each.

    click in standalone mode prints usage errors as multi-line rich boxes and lets every
    other exception through as a traceback. Here click raises instead, and each kind
    becomes one ``ledgerq: error:`` line: a usage error exits 2, a database failure that
    got past :func:`open_db` exits 1. ``--help`` and ``--version`` are not errors (0); a
    bare ``ledgerq`` (or ``ledgerq specs``) still prints its help, to stderr, exit 2.
    """
    click_exc = _click_exceptions()
    no_args_is_help = getattr(click_exc, "NoArgsIsHelpError", ())
    aborts = (typer.Abort, getattr(click_exc, "Abort", typer.Abort))
    try:
        result = app(args=None if args is None else list(args), prog_name="ledgerq",
                     standalone_mode=False)
    except click_exc.ClickException as exc:
        if isinstance(exc, no_args_is_help):
            exc.show()
            return USAGE_ERROR
        if isinstance(exc, click_exc.UsageError):
            report(usage_message(exc))
            return USAGE_ERROR
        report(exc.format_message())
        return int(exc.exit_code)
    except aborts:  # end of input at a prompt
        report("aborted")
        return DOMAIN_FAILURE
    except DatabaseError as exc:
        report(database_message(exc))
        return DOMAIN_FAILURE
    return result if isinstance(result, int) else OK


def main() -> NoReturn:
    """Console-script entry point (``python -m ledgerq`` too)."""
    sys.exit(run_cli())


__all__ = ["app", "cell", "main", "printable", "run_cli"]
