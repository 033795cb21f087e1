"""Markdown pages for each entity's lifecycle, generated from its policy (``ledgerq specs docs``).

The page is a pure function of the policy, so a test can regenerate it and compare
with the file on disk: docs cannot go stale without a failing test.
"""

from __future__ import annotations

from pathlib import Path

from ledgerq.lifecycle.diagrams import mermaid, ordered_edges
from ledgerq.lifecycle.registry import STANDARD_COLUMNS, EntityPolicy, Registry


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def _codes(values: frozenset[str] | list[str] | None, empty: str = "") -> str:
    if not values:
        return empty
    return ", ".join(f"`{v}`" for v in sorted(values))


def render_markdown(policy: EntityPolicy) -> str:
    """The lifecycle page of one entity: diagram, states, edges, reason codes, columns."""
    spec_name = Path(policy.source).name
    lines = [
        f"<!-- Generated from specs/{spec_name} by `ledgerq specs docs`. Do not edit by hand:"
        " edit the spec and regenerate. -->",
        f"# Lifecycle: `{policy.name}`",
        "",
    ]
    if policy.description:
        lines += [policy.description, ""]
    lines += [
        f"Projection table: `{policy.table}` · spec file: `specs/{spec_name}` · "
        f"{len(policy.states)} states, {len(ordered_edges(policy))} edges, "
        f"{len(policy.reason_codes)} reason codes.",
        "",
        "```mermaid",
        mermaid(policy).rstrip("\n"),
        "```",
        "",
        "## States",
        "",
        "| State | Initial | Terminal | Outcome | Allowed next states | Defers on entry "
        "| Description |",
        "|---|---|---|---|---|---|---|",
    ]
    for state, desc in policy.states.items():
        nxt = _codes(policy.edges.get(state, frozenset()), "none")
        outcome = policy.outcome(state)
        lines.append(
            f"| `{state}` | {'yes' if state in policy.initial else ''} | "
            f"{'yes' if state in policy.terminal else ''} | "
            f"{f'`{outcome}`' if outcome else ''} | {nxt} | "
            f"{', '.join(f'`{t}`' for t in policy.on_enter.get(state, ()))} | {_cell(desc)} |")
    lines += [
        "",
        "## Edges",
        "",
        "An edge not listed here is refused with a ValueError (\"not in the declared "
        "transition vocabulary\"). Actors empty means any actor type.",
        "",
        "| From | To | Event | Default reason | Actors | Requires guard | Requires patch "
        "| Clears | Description |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for src, dst in ordered_edges(policy):
        rule = policy.rule(src, dst)
        actors = _codes(rule.actors, "") if rule.actors is not None else ""
        event = f"`{rule.event}`" if rule.event else ""
        reason = f"`{rule.reason}`" if rule.reason else ""
        lines.append(
            f"| `{src}` | `{dst}` | {event} | {reason} | {actors} | "
            f"{_codes(rule.requires_guard)} | "
            f"{_codes(rule.requires_patch)} | {_codes(rule.clears)} | "
            f"{_cell(rule.description)} |")
    lines += [
        "",
        "## Reason codes",
        "",
        "| Code | Description |",
        "|---|---|",
    ]
    lines += [f"| `{code}` | {_cell(desc)} |" for code, desc in policy.reason_codes.items()]
    lines += [
        "",
        "## Columns",
        "",
        f"Guard allowlist: {_codes(policy.guard_columns, 'none')}.",
        "",
        f"Patch allowlist: {_codes(policy.patch_columns, 'none')}.",
        "",
    ]
    lines += [f"Column group `{name}`: {', '.join(f'`{c}`' for c in cols)}.\n"
              for name, cols in policy.column_groups.items()]
    lines += [
        "| Column | Declaration | Maintained by |",
        "|---|---|---|",
    ]
    for col, decl in policy.columns.items():
        who = "engine" if col in STANDARD_COLUMNS else "spec"
        lines.append(f"| `{col}` | `{_cell(str(decl))}` | {who} |")
    if policy.indexes:
        lines += ["", "## Indexes", "", "| Name | Columns | Unique | Where |", "|---|---|---|---|"]
        for ix in policy.indexes:
            where = f"`{_cell(ix.where)}`" if ix.where else ""
            keys = ", ".join(f"`{c}` desc" if c in ix.descending else f"`{c}`"
                             for c in ix.columns)
            lines.append(f"| `{ix.name}` | {keys} | "
                         f"{'yes' if ix.unique else ''} | {where} |")
    return "\n".join(lines) + "\n"


def render_all(registry: Registry) -> dict[str, str]:
    """File name -> page for every entity of the registry."""
    return {f"{p.name}.md": render_markdown(p) for p in registry.policies()}


def stale_pages(registry: Registry, out_dir: Path) -> list[str]:
    """Names of pages under ``out_dir`` that are missing or differ from their regeneration."""
    stale = []
    for name, text in render_all(registry).items():
        path = out_dir / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(name)
    return stale


__all__ = ["render_all", "render_markdown", "stale_pages"]
