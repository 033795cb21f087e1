"""``ledgerq migrate`` and ``ledgerq specs diff``: what a spec change does to a database.

Opening a database already migrates what a spec directory adds; these commands are for
the rest. ``migrate --plan`` shows every step a directory implies (additive, removal,
refused) without changing anything; ``migrate --apply`` makes the database's specs
exactly the directory's, removals included. ``specs diff`` compares two spec sets (a
directory, or what a database records) without touching either.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ledgerq.cli.app import app
from ledgerq.cli.db import DbOption, db_path, load_specs, open_db, root_specs, run, specs_only
from ledgerq.cli.failures import DOMAIN_FAILURE, die
from ledgerq.cli.render import JsonOption, emit_json, printable
from ledgerq.cli.specs import specs_app

MapOption = Annotated[list[str] | None, typer.Option(
    "--map-state", metavar="ENTITY:FROM=TO",
    help="Move every row in FROM to TO (with a fact whose reason code is the spec's "
         "<domain>.TO.migrated) before FROM is removed. Repeatable.", show_default=False)]


@app.command()
def migrate(
    ctx: typer.Context,
    db: DbOption = None,
    plan: Annotated[bool, typer.Option("--plan", help="Print what the specs would do to the "
                                       "database; change nothing.")] = False,
    apply: Annotated[bool, typer.Option("--apply", help="Make the database's specs exactly "
                                        "the spec directory's, removals included.")] = False,
    specs: Annotated[Path | None, typer.Option(
        "--specs", exists=True, help="Spec directory (default: --specs before the command, "
        "or the packaged specs).", show_default=False)] = None,
    map_state: MapOption = None,
    json_out: JsonOption = False,
) -> None:
    """Plan or apply a spec change: additive steps, removals, and what blocks them.

    Exit 0 when the plan can be (or was) applied, 1 when something is refused: the
    refusal names the state or column, its row count and a few ids.
    """
    from ledgerq.errors import MigrationRefused
    from ledgerq.lifecycle.evolution import StateMapping

    if plan == apply:
        die("pass exactly one of --plan and --apply")
    try:
        mappings = [StateMapping.parse(m) for m in map_state or []]
    except ValueError as exc:
        die(str(exc))
    path = db_path(ctx, db)
    directory = specs or root_specs(ctx)
    registry = load_specs(directory, packaged=not specs_only(ctx))

    async def go() -> tuple[list[str], list[str], bool]:
        async with open_db(ctx, path, registry=registry, migrate_on_open=False) as handle:
            planned = await handle.migrate(mappings, dry_run=True)
            if plan or planned.refusals:
                return planned.lines(), [str(r) for r in planned.refusals], False
            done = await handle.migrate(mappings)
            return done.lines(), [], True

    try:
        lines, refusals, applied = run(go())
    except MigrationRefused as exc:  # the data changed between the plan and the apply
        die(str(exc), DOMAIN_FAILURE)
    if json_out:
        emit_json({"db": path, "applied": applied, "steps": lines, "refusals": refusals})
    else:
        for line in lines or ["nothing to do: the database records exactly these specs"]:
            typer.echo(printable(line))
        if applied:
            typer.echo(f"applied {len(lines)} step(s) to {path}")
    if refusals:
        raise typer.Exit(DOMAIN_FAILURE)


@specs_app.command("diff")
def specs_diff(
    ctx: typer.Context,
    old: Annotated[str, typer.Argument(
        help="A spec directory (or file), or a database whose recorded specs to compare.",
        metavar="OLD")],
    new: Annotated[str | None, typer.Argument(
        help="A spec directory (or file), or a database (default: --specs, or the "
             "packaged specs).", metavar="NEW", show_default=False)] = None,
    json_out: JsonOption = False,
) -> None:
    """Print what changes from OLD to NEW, each change classified: additive (opening
    migrates it), removal (``migrate --apply`` does it) or refused (no version order
    explains it, e.g. a terminal state given outgoing edges)."""
    from ledgerq.lifecycle import evolution

    before = _spec_set(ctx, old)
    if new is not None:
        after = _spec_set(ctx, new)
    else:
        loaded = load_specs(root_specs(ctx), packaged=not specs_only(ctx))
        after = {p.name: evolution.policy_normal(p) for p in loaded.policies()}
    rows: list[dict[str, str]] = []
    for entity in [*after, *(e for e in before if e not in after)]:
        for change in evolution.diff(before.get(entity), after.get(entity)):
            rows.append({"class": _classify(change, before.get(entity), after.get(entity)),
                         "change": str(change)})
    if json_out:
        emit_json({"old": old, "new": new, "changes": rows})
        return
    for row in rows or [{"class": "unchanged", "change": "no differences"}]:
        typer.echo(printable(f"{row['class']}: {row['change']}"))


def _classify(change: Any, old: Any, new: Any) -> str:
    """A change as ``migrate`` would treat it, from the specs alone (a plan against a
    database also checks the data: a retyped column is refused only if it holds values)."""
    from ledgerq.lifecycle import evolution

    if change.kind == "table":
        return "refused"
    if old is not None and new is not None:
        terminal_gets_edges = (change.kind == "terminal" and change.action == "remove") or (
            change.kind == "edge" and change.action == "add"
            and change.name.split(" -> ")[0] in old["terminal"])
        if terminal_gets_edges:
            return "refused"
        if change.kind == "column" and change.action == "change" and evolution.retyped(
                old["columns"][change.name], new["columns"][change.name]):
            return "refused if rows hold values"
        if change.kind == "column" and change.action == "add":
            col = new["columns"][change.name]
            if col["not_null"] and col["default"] is None:
                return "refused if the table has rows"
    return evolution.classify(change)


def _spec_set(ctx: typer.Context, where: str) -> dict[str, Any]:
    """Normalized specs by entity: a spec directory's, or what a database records."""
    from ledgerq.errors import SpecError
    from ledgerq.lifecycle import evolution
    from ledgerq.lifecycle.registry import load_registry
    from ledgerq.store.db import is_postgres

    target = Path(where)
    if not is_postgres(where) and (target.is_dir() or target.suffix == ".toml"):
        try:
            return {p.name: evolution.policy_normal(p) for p in load_registry(target).policies()}
        except SpecError as exc:
            die(f"{where} is not a valid spec set ({len(exc.problems)} problem(s)); run "
                f"`ledgerq specs check {where}`", DOMAIN_FAILURE)

    async def go() -> dict[str, Any]:
        async with open_db(ctx, where, readonly=True) as handle:
            return dict(handle.recorded)

    recorded = run(go())
    if not recorded:
        die(f"{where} records no specs (a database from before ledgerq recorded them: "
            "open it once for writing)", DOMAIN_FAILURE)
    return recorded
