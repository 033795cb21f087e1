"""A lifecycle as a diagram: the mermaid text of ``ledgerq specs graph``, the docs pages and
the HTTP API, and the edge labels the dashboard's SVG (``ledgerq.web.diagram``) shares.

Kept apart from the policy so the model holds only what the engine enforces; every
drawing reads the same edge order and the same labels from here, so they cannot disagree.
"""

from __future__ import annotations

from ledgerq.lifecycle.registry import EdgeRule, EntityPolicy


def ordered_edges(policy: EntityPolicy) -> list[tuple[str, str]]:
    """Every declared edge, in the spec's state order: a diff of a spec shows in the same
    place of every drawing."""
    return [(src, dst) for src in policy.states for dst in policy.states
            if dst in policy.edges.get(src, frozenset())]


def edge_label(rule: EdgeRule) -> str:
    """The edge's event and default reason, then what it demands beyond being declared
    (actors, guards, patch, tokens), as every diagram labels it."""
    parts = []
    if rule.event is not None:
        parts.append(rule.event)
    if rule.reason is not None:
        parts.append("reason " + rule.reason)
    if rule.actors is not None:
        parts.append("actor " + "|".join(sorted(rule.actors)))
    if rule.requires_guard:
        parts.append("guard " + ",".join(sorted(rule.requires_guard)))
    if rule.requires_patch:
        parts.append("patch " + ",".join(sorted(rule.requires_patch)))
    if rule.fresh_tokens:
        parts.append("token " + ",".join(sorted(rule.fresh_tokens)))
    # Mermaid's state-diagram lexer ends a transition label at ':' or ';', so neither
    # may appear inside one.
    return " / ".join(parts)


def mermaid(policy: EntityPolicy) -> str:
    """A mermaid stateDiagram of the declared graph, in spec order."""
    lines = ["stateDiagram-v2"]
    lines += [f"    [*] --> {s}" for s in policy.states if s in policy.initial]
    for src, dst in ordered_edges(policy):
        label = edge_label(policy.rule(src, dst))
        lines.append(f"    {src} --> {dst}" + (f": {label}" if label else ""))
    lines += [f"    {s} --> [*]" for s in policy.states if s in policy.terminal]
    return "\n".join(lines) + "\n"


__all__ = ["edge_label", "mermaid", "ordered_edges"]
