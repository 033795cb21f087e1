"""``ledgerq schedule add|ls|show|pause|resume|rm``: schedules as data.

Every command here is a thin shell over :mod:`ledgerq.queue.scheduling.schedules` (validated there,
once): a refused definition is one line and exit 2, nothing written; an unknown schedule
is exit 1.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from ledgerq.cli.app import app, current_user
from ledgerq.cli.db import DbOption, db_path, open_db, run
from ledgerq.cli.failures import DOMAIN_FAILURE, die, text_option
from ledgerq.cli.render import JsonOption, cell, emit_json, fmt_ts, out, printable
from ledgerq.cli.tasks import task_args

schedule_app = typer.Typer(
    help="Recurring schedules (cron or interval) that fire queued runs, once per slot.",
    no_args_is_help=True)
app.add_typer(schedule_app, name="schedule")

REF_HELP = "Schedule id or name."


def _actor(actor: str | None) -> Any:
    from ledgerq.lifecycle.models import Actor

    return Actor(type="operator", id=text_option(actor, "--actor") if actor else current_user())


@schedule_app.command("add")
def add(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="A name, unique among live schedules.",
                                        show_default=False)],
    command: Annotated[list[str] | None, typer.Argument(
        help="command tasks: the argv each fire runs, after `--`.", show_default=False,
        metavar="ARGV")] = None,
    cron: Annotated[str | None, typer.Option(
        "--cron", help="Five-field cron expression, e.g. '0 2 * * 1-5' (in --tz).",
        show_default=False)] = None,
    every: Annotated[str | None, typer.Option(
        "--every", help="Interval: seconds or like 90s, 5m, 2h, 1d (multiples since the "
                        "epoch).", show_default=False)] = None,
    tz: Annotated[str, typer.Option("--tz", help="IANA timezone of --cron.")] = "UTC",
    catch_up: Annotated[str, typer.Option(
        "--catch-up", help="After downtime: latest (fire the latest missed slot once), all "
                           "or none.")] = "latest",
    overlap: Annotated[str, typer.Option(
        "--overlap", help="allow, or skip: a slot whose previous fire has not ended is "
                          "recorded skipped.")] = "allow",
    jitter: Annotated[float, typer.Option(
        "--jitter", help="Delay each fire by up to this many seconds (same on every "
                         "host).")] = 0.0,
    paused: Annotated[bool, typer.Option("--paused", help="Add it paused.")] = False,
    kind: Annotated[str, typer.Option("--kind", "-k", help="Action kind.")] = "command",
    target: Annotated[str, typer.Option("--target", "-t", help="Execution target.")] = "host",
    arg: Annotated[list[str] | None, typer.Option(
        "--arg", "-a", help="key=value or key:=JSON. Repeatable.", show_default=False)] = None,
    args_json: Annotated[str | None, typer.Option(
        "--args", help="All arguments as one JSON object.", show_default=False)] = None,
    argv: Annotated[str | None, typer.Option(
        "--argv", help="command tasks: the argv as one shlex-split string.",
        show_default=False)] = None,
    cap: Annotated[list[str] | None, typer.Option(
        "--cap", help="A required capability token. Repeatable.", show_default=False)] = None,
    retry_max: Annotated[int | None, typer.Option(
        "--retry-max", help="Retry policy of each fire: attempts in total.",
        show_default=False)] = None,
    retry_delay: Annotated[float, typer.Option(
        "--retry-delay", help="Retry policy: seconds before the first retry.")] = 1.0,
    timeout: Annotated[float | None, typer.Option(
        "--timeout", help="Seconds each fire may execute before it is killed.",
        show_default=False)] = None,
    priority: Annotated[int, typer.Option(
        "--priority", help="Claim priority of each fire (-1000..1000, higher first).")] = 0,
    queue: Annotated[str, typer.Option(
        "--queue", help="The named queue each fire waits in.")] = "default",
    db: DbOption = None,
    json_out: JsonOption = False,
) -> None:
    """Add a schedule; prints its id."""
    from ledgerq.queue.scheduling.schedules import add_schedule
    from ledgerq.queue.submission.application import RetryPolicy, TaskApplication

    text_option(name, "NAME")
    args = task_args(kind, command, argv, args_json, arg)
    try:
        retry = None if retry_max is None else RetryPolicy(retry_max, retry_delay)
        application = TaskApplication(kind, args, target, required_capabilities=list(cap or []),
                                      retry=retry, timeout_seconds=timeout,
                                      priority=priority, queue=queue)
    except ValueError as exc:
        die(str(exc))
    path = db_path(ctx, db)

    async def go() -> str:
        async with open_db(ctx, path, must_exist=False) as handle:
            try:
                return await add_schedule(handle, name, cron=cron, every=every,
                                          application=application, timezone=tz,
                                          catch_up=catch_up, overlap=overlap, jitter=jitter,
                                          paused=paused)
            except ValueError as exc:
                die(str(exc))

    sid = run(go())
    if json_out:
        emit_json({"id": sid})
    else:
        typer.echo(printable(sid))


def _when(row: dict[str, Any]) -> str:
    if row["cron"] is not None:
        return f"cron {row['cron']}" + ("" if row["timezone"] == "UTC" else f" {row['timezone']}")
    return f"every {row['every_seconds']:g}s"


def _overview(ctx: typer.Context, db: str | None, *, ref: str | None = None,
              include_retired: bool = False) -> list[dict[str, Any]]:
    from ledgerq.errors import NotFound
    from ledgerq.queue.scheduling.scheduler import schedule_overview

    path = db_path(ctx, db)

    async def go() -> list[dict[str, Any]]:
        async with open_db(ctx, path, readonly=True) as handle:
            try:
                return await schedule_overview(handle, ref=ref, include_retired=include_retired)
            except NotFound as exc:
                die(str(exc), DOMAIN_FAILURE)
            except ValueError as exc:
                die(str(exc))

    return run(go())


@schedule_app.command("ls")
def ls(
    ctx: typer.Context,
    all_: Annotated[bool, typer.Option("--all", help="Retired schedules too.")] = False,
    db: DbOption = None,
    json_out: JsonOption = False,
) -> None:
    """List schedules: when they fire, their next fire, their last fire and its outcome."""
    rows = _overview(ctx, db, include_retired=all_)
    if json_out:
        emit_json({"schedules": rows})
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in ("NAME", "STATUS", "WHEN", "NEXT FIRE", "LAST SLOT", "LAST OUTCOME", "ID"):
        table.add_column(name)
    for r in rows:
        last = r["last_fire"]
        table.add_row(cell(r["name"]), cell(r["status"]), cell(_when(r)),
                      fmt_ts(r["next_fire_at"]) or "-",
                      fmt_ts(last["slot_at"]) if last else "-",
                      cell(last["status"]) if last else "-", cell(r["id"]))
    out.print(table)


@schedule_app.command("show")
def show(
    ctx: typer.Context,
    ref: Annotated[str, typer.Argument(help=REF_HELP, show_default=False, metavar="SCHEDULE")],
    db: DbOption = None,
    json_out: JsonOption = False,
) -> None:
    """Show one schedule: its definition, next fire and last fire."""
    text_option(ref, "SCHEDULE")
    row = _overview(ctx, db, ref=ref)[0]
    if json_out:
        emit_json({"schedule": row})
        return
    head = Table(box=None, show_header=False, pad_edge=False)
    head.add_column(style="bold", no_wrap=True)
    head.add_column()
    for col, value in row.items():
        if value is None or value == "":
            continue
        if col.endswith("_at") and isinstance(value, int | float):
            head.add_row(cell(col), cell(f"{fmt_ts(value)}  ({value:.3f})"))
        else:
            head.add_row(cell(col), cell(value))
    out.print(head)


def _change(ctx: typer.Context, db: str | None, ref: str, verb: str, actor: str | None) -> None:
    from ledgerq.errors import NotFound
    from ledgerq.queue.scheduling import schedules

    text_option(ref, "SCHEDULE")
    fn = {"pause": schedules.pause_schedule, "resume": schedules.resume_schedule,
          "rm": schedules.retire_schedule}[verb]
    who = _actor(actor)
    path = db_path(ctx, db)

    async def go() -> bool:
        async with open_db(ctx, path) as handle:
            try:
                return await fn(handle, ref, actor=who)
            except NotFound as exc:
                die(str(exc), DOMAIN_FAILURE)
            except ValueError as exc:
                die(str(exc))

    if not run(go()):
        die(f"schedule {ref!r} cannot {verb} from its current state", DOMAIN_FAILURE)
    typer.echo(printable(f"{verb} {ref}: done"))


ActorOption = Annotated[str | None, typer.Option(
    "--actor", help="Operator id recorded on the fact (default: your user name).",
    show_default=False)]


@schedule_app.command("pause")
def pause(ctx: typer.Context,
          ref: Annotated[str, typer.Argument(help=REF_HELP, metavar="SCHEDULE")],
          actor: ActorOption = None, db: DbOption = None) -> None:
    """Stop firing; slots that pass while paused are never fired."""
    _change(ctx, db, ref, "pause", actor)


@schedule_app.command("resume")
def resume(ctx: typer.Context,
           ref: Annotated[str, typer.Argument(help=REF_HELP, metavar="SCHEDULE")],
           actor: ActorOption = None, db: DbOption = None) -> None:
    """Fire again, from now on."""
    _change(ctx, db, ref, "resume", actor)


@schedule_app.command("rm")
def rm(ctx: typer.Context,
       ref: Annotated[str, typer.Argument(help=REF_HELP, metavar="SCHEDULE")],
       actor: ActorOption = None, db: DbOption = None) -> None:
    """Retire a schedule: it never fires again; its runs and history are kept."""
    _change(ctx, db, ref, "rm", actor)
