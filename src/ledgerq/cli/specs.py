"""``ledgerq specs``: check, draw and document the lifecycle spec files."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ledgerq.cli.app import app
from ledgerq.cli.db import db_path, load_specs, open_db, root_specs, run, specs_only
from ledgerq.cli.failures import DOMAIN_FAILURE, die
from ledgerq.cli.render import JsonOption, emit_json, printable

if TYPE_CHECKING:
    from ledgerq.lifecycle.registry import Registry
    from ledgerq.lifecycle.spec import SpecProblem

specs_app = typer.Typer(help="Validate, draw and document the lifecycle spec files.",
                        no_args_is_help=True)
app.add_typer(specs_app, name="specs")

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
    specs: SpecsOption = None,
    json_out: JsonOption = False,
    db: Annotated[str | None, typer.Option(
        "--db", help="Also check that every task a state defers (on_enter) is one an app "
        "has recorded in this database, and takes what an entry gives it.",
        show_default=False)] = None,
) -> None:
    """Validate spec files, and that they allow every move the queue makes; every problem
    on its own line as FILE: $.PATH: MESSAGE (exit 1)."""
    from ledgerq.errors import SpecError
    from ledgerq.lifecycle.registry import (
        held_groups_left_held,
        load_registry,
        packaged_specs_dir,
    )
    from ledgerq.queue.moves import ENTITY, check

    root = directory or specs or root_specs(ctx) or packaged_specs_dir()
    files = [str(root)] if root.is_file() else [str(f) for f in sorted(root.glob("*.toml"))]
    try:
        # The queue's own moves are checked only once the files are valid on their own.
        registry = load_registry(root, packaged=not specs_only(ctx))
        if not specs_only(ctx) or ENTITY in registry.entities:
            registry = check(registry)
        held = [p for policy in registry.policies() for p in held_groups_left_held(policy)]
        if held:
            raise SpecError(held)
        if db is not None:
            unserved = run(_unrecorded_tasks(ctx, db_path(ctx, db), registry))
            if unserved:
                raise SpecError(unserved)
    except SpecError as exc:
        if json_out:
            emit_json({"ok": False, "dir": str(root), "files": files, "entities": [],
                       "problems": [{"file": p.file, "path": p.path, "message": p.message}
                                    for p in exc.problems]})
        else:
            for p in exc.problems:
                typer.echo(printable(f"{p.file}: {p.path}: {p.message}"))
            sys.stderr.write(f"ledgerq: error: {len(exc.problems)} problem(s) in {root}\n")
        raise typer.Exit(DOMAIN_FAILURE) from None
    if json_out:
        emit_json({"ok": True, "dir": str(root), "files": files,
                   "entities": sorted(registry.entities), "problems": []})
    else:
        names = ", ".join(sorted(registry.entities))
        typer.echo(f"ok: {len(files)} file(s), {len(registry.entities)} entities ({names}) "
                   f"in {root}")


async def _unrecorded_tasks(ctx: typer.Context, path: str, registry: Registry
                            ) -> list[SpecProblem]:
    """The ``on_enter`` tasks no app has recorded in the database at ``path`` (nothing
    would serve their runs), and those whose recorded parameters do not take an entry's
    two arguments (every run would fail)."""
    from ledgerq.errors import InvalidInput
    from ledgerq.lifecycle.entering import Entry
    from ledgerq.lifecycle.spec import SpecProblem
    from ledgerq.queue.submission import task_kinds

    async with open_db(ctx, path, readonly=True, registry=registry) as handle:
        recorded = await task_kinds.recorded(handle)
    sample = {"entity_id": "id", "fact": Entry(
        id="id", entity_type="entity", entity_id="id", previous_status=None, status="s",
        reason_code="r", reason_summary=None, source="system", actor=None, created_at=0.0,
        entity_version=1)}
    found = []
    for policy in registry.policies():
        for state, tasks in policy.on_enter.items():
            where = f"$.states.{state}.on_enter"
            for task in tasks:
                kind = recorded.get(task)
                if kind is None:
                    found.append(SpecProblem(policy.source, where, (
                        f"task {task!r} is not recorded in {path}: no app that declares it "
                        "has opened the database, so no worker serves its runs")))
                    continue
                try:
                    kind.check(dict(sample))
                except InvalidInput as exc:
                    found.append(SpecProblem(policy.source, where, (
                        f"task {task!r} does not take what an entry gives it "
                        f"(entity_id, fact): {exc}")))
    return found


@specs_app.command("graph")
def specs_graph(
    ctx: typer.Context,
    entity: Annotated[str, typer.Argument(help="Entity name, e.g. schedule_run.",
                                          show_default=False, metavar="ENTITY")],
    specs: SpecsOption = None,
    json_out: JsonOption = False,
) -> None:
    """Print an entity's lifecycle as a mermaid stateDiagram."""
    from ledgerq.lifecycle.diagrams import mermaid, ordered_edges

    registry = load_specs(specs or root_specs(ctx), packaged=not specs_only(ctx))
    try:
        policy = registry.entity(entity)
    except ValueError as exc:
        die(str(exc))
    if json_out:
        emit_json({
            "entity": policy.name, "table": policy.table, "states": list(policy.states),
            "initial": sorted(policy.initial), "terminal": sorted(policy.terminal),
            "edges": [{"from": a, "to": b} for a, b in ordered_edges(policy)],
            "mermaid": mermaid(policy),
        })
    else:
        sys.stdout.write(mermaid(policy))


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

    registry = load_specs(specs or root_specs(ctx), packaged=not specs_only(ctx))
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
