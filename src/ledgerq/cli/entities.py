"""``ledgerq entity ls``, ``ledgerq move`` and ``ledgerq send``: any entity's rows, read
and moved from the command line through its handle (``db.entity``).

An entity the loaded specs lack (an app's own, recorded in the database) is judged by
the spec the database recorded for it, so an operator needs no copy of it.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from ledgerq.cli.app import app, current_user
from ledgerq.cli.db import DbOption, db_path, open_db, run
from ledgerq.cli.failures import DOMAIN_FAILURE, die, text_option
from ledgerq.cli.render import JsonOption, cell, emit_json, fmt_ts, out, printable
from ledgerq.cli.tasks import parse_arg

entity_app = typer.Typer(no_args_is_help=True, add_completion=False,
                         help="Any entity's rows: list them (ledgerq move / send move them).")
app.add_typer(entity_app, name="entity")

EntityArg = Annotated[str, typer.Argument(help="The entity (its spec's `entity`).",
                                          show_default=False, metavar="ENTITY")]


def handle(db: Any, name: str) -> Any:
    """The entity's handle (``db.entity``: by the loaded specs, else by the database's
    record), or one error line naming the entities there are."""
    if name not in db.registry.entities and name not in db.recorded:
        known = sorted({*db.registry.entities, *db.recorded})
        die(f"no entity {name!r}; entities: {', '.join(known)}")
    return db.entity(name)


@entity_app.command("ls")
def ls(
    ctx: typer.Context,
    entity: EntityArg,
    status: Annotated[list[str] | None, typer.Option(
        "--status", "-s", help="Only rows in this state. Repeatable.",
        show_default=False)] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=1000)] = 50,
    cursor: Annotated[str | None, typer.Option(
        "--cursor", help="Continue after a page (its next_cursor).", show_default=False)
    ] = None,
    db: DbOption = None,
    json_out: JsonOption = False,
) -> None:
    """An entity's rows, newest first (read-only)."""
    from ledgerq.errors import InvalidInput

    path = db_path(ctx, db)

    async def go() -> Any:
        async with open_db(ctx, path, readonly=True) as handle_db:
            try:
                return await handle(handle_db, entity).list(status=status, limit=limit,
                                                             cursor=cursor)
            except InvalidInput as exc:
                die(str(exc))

    page = run(go())
    if json_out:
        emit_json({"items": page.items, "next_cursor": page.next_cursor})
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name in ("ID", "STATUS", "VERSION", "UPDATED", "REASON"):
        table.add_column(name)
    for row in page.items:
        table.add_row(cell(row["id"]), cell(row["status"]), cell(row["version"]),
                      fmt_ts(row.get("updated_at") or row.get("created_at")),
                      cell(row.get("status_reason_code") or ""))
    out.print(table)
    if page.next_cursor:
        out.print(printable(f"next page: --cursor {page.next_cursor}"))


def _move(ctx: typer.Context, entity: str, entity_id: str, *, state: str | None,
          event: str | None, reason: str | None, patch: list[str] | None,
          actor: str | None, expect: str | None, db: str | None, json_out: bool) -> None:
    from ledgerq.errors import Conflict, InvalidInput, NotFound
    from ledgerq.lifecycle.models import Actor

    who = Actor(type="operator", id=text_option(actor, "--actor") if actor
                else text_option(current_user(), "the user name (LOGNAME/USER)"))
    values = dict(parse_arg(item) for item in patch or [])
    path = db_path(ctx, db)

    async def go() -> Any:
        async with open_db(ctx, path) as handle_db:
            rows = handle(handle_db, entity)
            try:
                if event is not None:
                    return await rows.send(entity_id, event, actor=who, reason=reason,
                                           patch=values or None, expect=expect)
                return await rows.move(entity_id, str(state), actor=who, reason=reason,
                                       patch=values or None, expect=expect)
            except (Conflict, NotFound) as exc:
                die(str(exc), DOMAIN_FAILURE)
            except InvalidInput as exc:
                die(str(exc))

    result = run(go())
    if json_out:
        emit_json(result.model_dump())
    else:
        typer.echo(printable(f"{entity} {entity_id}: {result.previous_state} -> "
                             f"{result.current_state}"))


Patch = Annotated[list[str] | None, typer.Option(
    "--patch", help="A column to set: key=value (text) or key:=JSON. Repeatable.",
    show_default=False)]
Reason = Annotated[str | None, typer.Option(
    "--reason", help="The reason code (default: the edge's, or the state's one code).",
    show_default=False)]
Actor_ = Annotated[str | None, typer.Option(
    "--actor", help="Operator id recorded on the fact (default: your user name).",
    show_default=False)]
Expect = Annotated[str | None, typer.Option(
    "--expect", help="Refuse (exit 1) unless the row is in this state.",
    show_default=False)]


@app.command()
def move(
    ctx: typer.Context,
    entity: EntityArg,
    entity_id: Annotated[str, typer.Argument(metavar="ID", show_default=False)],
    state: Annotated[str, typer.Argument(metavar="STATE", show_default=False,
                                         help="The state to move it to.")],
    reason: Reason = None, patch: Patch = None, actor: Actor_ = None,
    expect: Expect = None, db: DbOption = None, json_out: JsonOption = False,
) -> None:
    """Move one row of any entity to a state, as an operator (one guarded move, one fact).

    Exit 2 when the spec forbids the move; 1 when the row is missing or moved meanwhile.
    """
    _move(ctx, entity, entity_id, state=state, event=None, reason=reason, patch=patch,
          actor=actor, expect=expect, db=db, json_out=json_out)


@app.command()
def send(
    ctx: typer.Context,
    entity: EntityArg,
    entity_id: Annotated[str, typer.Argument(metavar="ID", show_default=False)],
    event: Annotated[str, typer.Argument(metavar="EVENT", show_default=False,
                                         help="An event the entity's spec names.")],
    reason: Reason = None, patch: Patch = None, actor: Actor_ = None,
    expect: Expect = None, db: DbOption = None, json_out: JsonOption = False,
) -> None:
    """Send an event to one row of any entity: the edge the spec names by it."""
    _move(ctx, entity, entity_id, state=None, event=event, reason=reason, patch=patch,
          actor=actor, expect=expect, db=db, json_out=json_out)


__all__ = ["handle"]
