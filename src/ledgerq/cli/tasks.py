"""The commands about individual runs: ``submit``, ``ls``, ``show`` and ``cancel``."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from ledgerq.cli.app import app, current_user
from ledgerq.cli.db import (
    DbOption,
    db_path,
    load_specs,
    open_db,
    resolve_run,
    root_specs,
    run,
)
from ledgerq.cli.failures import DOMAIN_FAILURE, check_choice, die, text_option
from ledgerq.cli.render import (
    JsonOption,
    cell,
    emit_json,
    err_console,
    fmt_ts,
    out,
    printable,
    styled_status,
)
from ledgerq.queue.reads import RUN_ENTITY, run_status

if TYPE_CHECKING:
    from ledgerq.store.db import StateDB

#: Run ids are time-ordered (UUIDv7): the random part, and so the easy short piece, is the tail.
ID_HELP = "Run id, or a unique prefix or suffix of 4+ characters."


def parse_json(raw: str, option: str) -> Any:
    """JSON from an option, or one usage error naming the option.

    The parser recurses: JSON nested thousands of levels deep raised a bare
    RecursionError traceback before the application's depth limit could refuse it.
    """
    from ledgerq.queue.submission.application import MAX_ARGS_DEPTH

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


def task_args(kind: str, command: list[str] | None, argv: str | None,
              args_json: str | None, pairs: list[str] | None) -> dict[str, Any]:
    """A task's args from the command line: an argv after ``--`` or as ``--argv`` (command
    tasks only), ``--args JSON`` and ``--arg`` pairs; shared by submit and schedule add."""
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
    return build_args(args_json, pairs or [], argv_list)


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


def _start_time(delay: str | None, at: str | None) -> float | None:
    """``--delay`` or ``--at`` as epoch seconds (None: start now)."""
    from ledgerq.durations import parse_duration, parse_instant

    if delay is not None and at is not None:
        die("give a start time either as --delay or as --at, not both")
    try:
        if delay is not None:
            return time.time() + parse_duration(delay, "--delay")
        return parse_instant(at, "--at") if at is not None else None
    except ValueError as exc:
        die(str(exc))


async def _typed_task(db: Any, application: Any) -> Any:
    """``application`` of a recorded task kind, its text arguments typed by the recorded
    parameters; an unrecorded kind is refused naming the kinds there are."""
    from dataclasses import replace

    from ledgerq.queue.submission import task_kinds

    kind = application.action_kind
    known = await task_kinds.recorded(db)
    if kind not in known:
        names = ", ".join(sorted(known)[:10]) or "none recorded"
        die(f"unknown action_kind {kind!r}: not one of the ADR-0071 queue's kinds, and no "
            f"app recorded a task of that name in this database (tasks: {names})")
    return replace(application, args=known[kind].coerce(application.args))


async def _other_entity_row(db: Any, entity_id: str
                            ) -> tuple[dict[str, Any], list[dict[str, Any]], None] | None:
    """``({"entity", "row"}, facts, None)`` of the row of a non-run entity with this id,
    or None: every entity the loaded specs or the database's records declare."""
    from ledgerq.cli.entities import handle
    from ledgerq.errors import NotFound

    names = sorted({*db.registry.entities, *db.recorded} - {RUN_ENTITY})
    for name in names:
        rows = handle(db, name)
        try:
            row = await rows.get(entity_id)
        except NotFound:
            continue
        return {"entity": name, "row": row}, await rows.history(entity_id), None
    return None


def _show_entity_row(found: dict[str, Any], facts: list[dict[str, Any]],
                     json_out: bool) -> None:
    name, row = found["entity"], found["row"]
    if json_out:
        emit_json({"entity": name, "row": row, "history": facts})
        return
    out.print(printable(f"{name} {row['id']}: {row['status']}"))
    for key, value in row.items():
        if key not in ("id", "status") and value is not None:
            out.print(cell(f"  {key}: {value}"))
    hist = Table(box=None, header_style="bold", pad_edge=False, title="history",
                 title_justify="left")
    for col in ("V", "AT", "FROM", "TO", "REASON", "ACTOR"):
        hist.add_column(col)
    for f in facts:
        hist.add_row(cell(f["entity_version"]), fmt_ts(f["created_at"]),
                     cell(f["previous_status"] or "-"), cell(f["status"]),
                     cell(f["reason_code"]), cell(f"{f['source']}:{f['actor']}"))
    out.print(hist)


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
    delay: Annotated[str | None, typer.Option(
        "--delay", metavar="DURATION", help="Start no sooner than this from now (30s, 5m, "
        "2h, 1d); the run waits in `delayed` until then.", show_default=False)] = None,
    at: Annotated[str | None, typer.Option(
        "--at", metavar="ISO8601", help="Start no sooner than this time (local time unless "
        "it has an offset).", show_default=False)] = None,
    priority: Annotated[int, typer.Option(
        "--priority", help="Claimed before runs of lower priority (-1000..1000); "
        "ties go oldest first.")] = 0,
    queue: Annotated[str, typer.Option(
        "--queue", help="The named queue it waits in; only workers serving it "
        "(ledgerq worker --queue) claim it.")] = "default",
    db: DbOption = None,
    json_out: JsonOption = False,
) -> None:
    """Submit one task; prints its run id. Validated exactly like submit_task()."""
    from ledgerq.queue.submission.application import (
        ACTION_ALIASES,
        ACTION_KINDS,
        RetryPolicy,
        TaskApplication,
        validate,
    )

    args = task_args(kind, command, argv, args_json, arg)
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
    not_before = _start_time(delay, at)
    application = TaskApplication(
        action_kind=kind, args=args, execution_target=target,
        required_capabilities=list(cap or []), library_ref=library_ref,
        library_content_hash=library_hash, idempotency_key=idempotency_key, retry=retry,
        timeout_seconds=timeout, depends_on=tuple(depends_on or ()), not_before=not_before,
        priority=priority, queue=queue,
    )
    # A kind outside the ADR-0071 queue's is a Python task its app recorded in the
    # database: checked (and its text arguments typed) against what was recorded there.
    is_task = kind not in ACTION_KINDS and kind not in ACTION_ALIASES
    if not is_task:
        try:
            validate(application)
        except (ValueError, TypeError) as exc:
            die(str(exc))
    path = db_path(ctx, db)

    async def go() -> tuple[str, str]:
        from ledgerq.queue.submission.submit import submit_task

        nonlocal application
        async with open_db(ctx, path, must_exist=is_task) as handle:
            if is_task:
                application = await _typed_task(handle, application)
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
    queue: Annotated[list[str] | None, typer.Option(
        "--queue", help="Only runs in this named queue. Repeatable.",
        show_default=False)] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=0, help="Page size.")] = 50,
    offset: Annotated[int, typer.Option("--offset", min=0, help="Runs to skip.")] = 0,
    since: Annotated[str | None, typer.Option(
        "--since", metavar="DURATION", help="Only runs that moved within this long (e.g. "
        "10m, 1h).", show_default=False)] = None,
    follow: Annotated[bool, typer.Option(
        "--follow", "-f", help="Then print every move as it happens, until Ctrl-C "
        "(--json: one JSON fact per line).")] = False,
    db: DbOption = None,
    json_out: JsonOption = False,
) -> None:
    """List runs, newest first."""
    from ledgerq.cli.watch import catch_stop_signals, follow_runs, since_time

    if follow:
        catch_stop_signals()
    from ledgerq.queue.reads import list_runs
    from ledgerq.queue.submission.application import (
        ACTION_ALIASES,
        ACTION_KINDS,
        EXECUTION_TARGETS,
        queue_name_problem,
    )

    statuses = list(status or [])
    kinds = [ACTION_ALIASES.get(k, k) for k in kind or []]
    check_choice("action kind", kinds, list(ACTION_KINDS))
    targets = list(target or [])
    check_choice("execution target", targets, sorted(EXECUTION_TARGETS))
    queues = list(queue or [])
    for name in queues:
        problem = queue_name_problem(name)
        if problem is not None:
            die(f"--queue {problem}")
    moved_since = since_time(since)
    path = db_path(ctx, db)
    started = time.time()  # a follow prints the moves after the listing's snapshot

    async def go() -> Any:
        async with open_db(ctx, path, readonly=True) as handle:
            # States as the database records them (an app's own among them).
            policy = handle.registry.entity(RUN_ENTITY)
            check_choice("status", statuses, list(policy.states))
            try:
                return policy, await list_runs(handle, statuses=statuses, kinds=kinds,
                                               targets=targets, limit=limit, offset=offset,
                                               since=moved_since, queues=queues)
            except ValueError as exc:
                die(str(exc))

    policy, page = run(go())
    if follow:
        if not json_out:
            _print_page(page, policy)
        follow_runs(ctx, path, policy, statuses=statuses, kinds=kinds, targets=targets,
                    json_lines=json_out, since=started, queues=queues)
        return
    if json_out:
        emit_json({"runs": page.runs, "total": page.total, "limit": page.limit,
                   "offset": page.offset, "columns": list(page.columns)})
        return
    _print_page(page, policy)


def _print_page(page: Any, policy: Any) -> None:
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("ID", no_wrap=True, min_width=36)
    for name in ("STATUS", "KIND", "TARGET", "QUEUE", "PRI", "CREATED", "EXIT", "WORKER",
                 "REASON"):
        table.add_column(name)
    for r in page.runs:
        table.add_row(cell(r["id"]), styled_status(policy, r["status"]), cell(r["action_kind"]),
                      cell(r["execution_target"] or ""), cell(r.get("queue", "default")),
                      cell(r.get("priority", 0)), fmt_ts(r["created_at"]),
                      "" if r["exit_code"] is None else cell(r["exit_code"]),
                      cell(r["leased_by"] or ""), cell(r["status_reason_code"] or ""))
    out.print(table)
    shown = len(page.runs)
    first = page.offset + 1 if shown else page.offset
    more = (f"; --offset {page.offset + shown} for more"
            if page.offset + shown < page.total else "")
    err_console.print(f"[dim]{first}-{page.offset + shown} of {page.total} run(s), "
                      f"newest first{more}[/dim]")


async def _schedule_of(handle: StateDB, row: dict[str, Any]) -> dict[str, Any] | None:
    """The schedule a run was fired by (id, name, status, timezone), if ledgerq's scheduler
    fired it and the specs know schedules."""
    from ledgerq.errors import NotFound
    from ledgerq.queue.moves import SCHEDULE_ENTITY
    from ledgerq.queue.scheduling.schedules import get_schedule

    if not row.get("schedule_id") or SCHEDULE_ENTITY not in handle.registry.entities:
        return None
    try:
        found = await get_schedule(handle, row["schedule_id"])
    except NotFound:  # an external scheduler's id: only the schedules table has it
        return None
    return {k: found[k] for k in ("id", "name", "status", "timezone")}


def schedule_slot(slot: float, tz: str) -> str:
    from ledgerq.queue.scheduling.slots import iso

    return iso(slot, tz)


@app.command()
def show(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help=ID_HELP,
                                          show_default=False, metavar="ID")],
    follow: Annotated[bool, typer.Option(
        "--follow", "-f", help="Then print its moves as they happen, until it ends or "
        "Ctrl-C (--json: one JSON fact per line after the run).")] = False,
    archive: Annotated[Path | None, typer.Option(
        "--archive", metavar="FILE", help="Look the run up in this archive file (made by "
        "`ledgerq archive`) instead of the database.", show_default=False)] = None,
    db: DbOption = None,
    json_out: JsonOption = False,
) -> None:
    """Show one run, or a row of any entity by its full id: the row and its facts."""
    from ledgerq.cli.watch import catch_stop_signals
    from ledgerq.queue.reads import get_run, resolve_run_id, run_history

    if archive is not None:
        if follow:
            die("--follow needs a live run; an archived one has ended")
        _show_archived(ctx, archive, run_id, json_out)
        return
    if follow:
        catch_stop_signals()

    path = db_path(ctx, db)

    async def go() -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any] | None, Any]:
        async with open_db(ctx, path, readonly=True) as handle:
            text_option(run_id, "ID")
            try:
                full = await resolve_run_id(handle, run_id)
            except LookupError as exc:
                # Not a run: a row of another entity, by its whole id.
                found = await _other_entity_row(handle, run_id)
                if found is None:
                    die(str(exc).strip("'\""), DOMAIN_FAILURE)
                return (*found, None)
            except ValueError as exc:
                die(str(exc))
            row = await get_run(handle, full)
            return (row, await run_history(handle, full), await _schedule_of(handle, row),
                    handle.registry.entity(RUN_ENTITY))

    row, facts, schedule, policy = run(go())
    if "entity" in row and set(row) == {"entity", "row"}:
        _show_entity_row(row, facts, json_out)
        return
    if json_out:
        emit_json({"run": row, "history": facts,
                   **({} if schedule is None else {"schedule": schedule})})
    else:
        _print_run(row, facts, policy, schedule)
    if follow and row["status"] not in policy.terminal:
        from ledgerq.cli.watch import follow_run

        follow_run(ctx, db_path(ctx, db), policy, row["id"],
                   max((f["entity_version"] for f in facts), default=0), json_lines=json_out)


def _show_archived(ctx: typer.Context, archive: Path, run_id: str, json_out: bool) -> None:
    """``show --archive``: the same rendering as a live run's, from the file alone (no
    database is opened)."""
    from ledgerq.errors import NotFound
    from ledgerq.queue.maintenance.archive import read_archived_run

    text_option(run_id, "ID")
    policy = load_specs(root_specs(ctx)).entity(RUN_ENTITY)
    try:
        found = read_archived_run(archive, run_id, policy)
    except NotFound as exc:
        die(str(exc).strip("'\""), DOMAIN_FAILURE)
    except ValueError as exc:
        die(str(exc), DOMAIN_FAILURE)
    if json_out:
        emit_json({"run": found.run, "history": found.history,
                   "archive": {"file": str(archive), **found.manifest}})
        return
    err_console.print(f"[dim]archived in {printable(str(archive))} "
                      f"(archive {printable(found.manifest.get('archive_id', '?'))})[/dim]")
    _print_run(found.run, found.history, policy, None)


def _print_run(row: dict[str, Any], facts: list[dict[str, Any]], policy: Any,
               schedule: dict[str, Any] | None) -> None:
    head = Table(box=None, show_header=False, pad_edge=False)
    head.add_column(style="bold", no_wrap=True)
    head.add_column()
    from ledgerq.cli.output import OUTPUT_COLUMNS, print_output

    if schedule is not None:
        slot = row.get("slot_at")
        head.add_row(cell("schedule"), cell(
            f"{schedule['name']} ({schedule['status']}), slot "
            f"{'-' if slot is None else schedule_slot(slot, schedule['timezone'])}"))
    for col, value in row.items():
        if value is None or value == "" or value == [] or value == {} or col in OUTPUT_COLUMNS:
            continue
        if col.endswith("_at") and isinstance(value, int | float):
            shown: Text = cell(f"{fmt_ts(value)}  ({value:.3f})")
        elif col == "status":
            shown = styled_status(policy, value)
        elif isinstance(value, dict | list):
            # ensure_ascii=False: a non-ASCII argument reads as itself; printable() then
            # escapes only what a terminal would act on.
            shown = cell(json.dumps(value, sort_keys=True, ensure_ascii=False))
        else:
            shown = cell(value)
        head.add_row(cell(col), shown)
    out.print(head)
    out.print()
    if print_output(row):  # multi-line: below the row, not in a cell
        out.print()
    hist = Table(title=f"history ({len(facts)} facts)", title_justify="left",
                 header_style="bold", box=None, pad_edge=False)
    for name in ("V", "AT", "FROM", "TO", "REASON", "ACTOR", "SUMMARY"):
        hist.add_column(name)
    for f in facts:
        hist.add_row(cell(f["entity_version"]), fmt_ts(f["created_at"]),
                     cell(f["previous_status"] or "(created)"),
                     styled_status(policy, f["status"]),
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
    from ledgerq.queue.submission.submit import cancel_task

    path = db_path(ctx, db)
    # The actor and the summary are stored on the fact: text the database can hold.
    who = Actor(type="operator", id=text_option(actor, "--actor") if actor
                else text_option(current_user(), "the user name (LOGNAME/USER)"))
    text_option(reason, "--reason")

    async def go() -> tuple[str, str, bool, str]:
        async with open_db(ctx, path) as handle:
            full = await resolve_run(handle, run_id)
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
