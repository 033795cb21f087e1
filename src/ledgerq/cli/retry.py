"""``ledgerq retry``: run ended runs again, one by id or many by status and age."""

from __future__ import annotations

from typing import Annotated

import typer

from ledgerq.cli.app import app
from ledgerq.cli.db import DbOption, db_path, open_db, run
from ledgerq.cli.failures import DOMAIN_FAILURE, check_choice, die, text_option
from ledgerq.cli.render import JsonOption, emit_json, err_console, printable
from ledgerq.cli.watch import since_time
from ledgerq.errors import InvalidInput
from ledgerq.queue.reads import RUN_ENTITY

#: Runs read per page when a bulk retry collects what it matches.
PAGE = 500


@app.command()
def retry(
    ctx: typer.Context,
    run_ids: Annotated[list[str] | None, typer.Argument(
        help="Ended runs to run again (ids, or unique prefixes or suffixes of 4+ "
             "characters).", show_default=False, metavar="ID...")] = None,
    status: Annotated[list[str] | None, typer.Option(
        "--status", "-s", help="Bulk: every run that ended in this status. Repeatable.",
        show_default=False)] = None,
    since: Annotated[str | None, typer.Option(
        "--since", metavar="DURATION", help="Bulk: only runs that ended within this long "
        "(e.g. 30m, 1h, 2d).", show_default=False)] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Bulk: list what would be run "
                                          "again; write nothing.")] = False,
    actor: Annotated[str | None, typer.Option(
        "--actor", help="Operator id recorded on the new runs' facts (default: your user "
        "name).", show_default=False)] = None,
    reason: Annotated[str, typer.Option("--reason", help="Summary recorded on the facts.")] = "",
    db: DbOption = None,
    json_out: JsonOption = False,
) -> None:
    """Run ended runs again: each becomes a new queued run of the same application,
    linked to the original (chain_parent_id); the original stays as it ended.

    Exit 1 when a run named has not ended or does not exist: then nothing is created.
    """
    from ledgerq.cli.app import current_user
    from ledgerq.cli.db import resolve_run
    from ledgerq.lifecycle.models import Actor
    from ledgerq.queue.reads import list_runs
    from ledgerq.queue.submission.rerun import retry_runs

    ids = list(run_ids or [])
    statuses = list(status or [])
    if ids and (statuses or since is not None):
        die("give run ids or --status/--since, not both")
    if not ids and not statuses:
        die("name runs to retry: ID... or --status STATUS [--since DURATION]")
    if since is not None and not statuses:
        die("--since needs --status")
    ended_since = since_time(since, "--since")
    who = Actor(type="operator", id=text_option(actor, "--actor") if actor
                else text_option(current_user(), "the user name (LOGNAME/USER)"))
    text_option(reason, "--reason")
    path = db_path(ctx, db)

    async def go() -> list[tuple[str, str]]:
        async with open_db(ctx, path) as handle:
            # Ended as the database records it (an app's own terminal states among them).
            policy = handle.registry.entity(RUN_ENTITY)
            check_choice("ended status", statuses, sorted(policy.terminal))
            if ids:
                chosen = [await resolve_run(handle, i) for i in ids]
            else:
                chosen = []
                while True:
                    page = await list_runs(handle, statuses=statuses, limit=PAGE,
                                           offset=len(chosen), since=ended_since,
                                           since_column="ended_at")
                    chosen += [r["id"] for r in page.runs]
                    if len(page.runs) < PAGE:
                        break
            if dry_run:
                return [(c, "") for c in chosen]
            try:
                made = await retry_runs(handle, chosen, actor=who, summary=reason)
            except LookupError as exc:
                die(str(exc).strip("'\""), DOMAIN_FAILURE)
            except InvalidInput as exc:
                die(str(exc), DOMAIN_FAILURE)
            return list(zip(chosen, made, strict=True))

    pairs = run(go())
    if json_out:
        emit_json({"dry_run": dry_run, "retried": [
            {"id": old, **({} if dry_run else {"new_id": new})} for old, new in pairs]})
        return
    for old, new in pairs:
        typer.echo(printable(f"would retry {old}" if dry_run else f"retried {old} as {new}"))
    if not ids:
        err_console.print(f"[dim]{len(pairs)} run(s) {'matched' if dry_run else 'retried'}"
                          "[/dim]")



