"""A lifecycle's diagram as SVG, drawn on the server from the registry's graph.

Why not mermaid in the browser: the dashboard must work with no CDN and a CSP without
inline script or style, and mermaid (a 3 MB bundle) injects ``<style>`` elements into
the SVG it makes. The graph is small (a dozen states), so a layered drawing is enough:
states are ranked by the longest path from the initial states once back edges (retries,
requeues) are set aside, drawn top to bottom in spec order within a rank, forward edges
as straight arrows, back and same-rank edges as curves, self-loops as loops. Initial
states carry a start arrow, terminal states a double border, as in a state chart. Every
piece of text is XML-escaped; the drawing uses presentation attributes only, no CSS.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from xml.sax.saxutils import escape

from ledgerq.lifecycle import diagrams
from ledgerq.lifecycle.registry import EntityPolicy

CHAR_WIDTH = 7.2
NODE_HEIGHT = 30
PAD_X = 14
GAP_X = 28
RANK_GAP = 70
MARGIN = 30


@dataclass
class _Node:
    name: str
    rank: int
    x: float = 0.0
    y: float = 0.0
    width: float = 0.0


def edge_label(policy: EntityPolicy, source: str, target: str) -> str:
    """What an edge requires, as the mermaid diagram labels it (actors, guards, patch)."""
    return diagrams.edge_label(policy.edge_rules[(source, target)])


#: Every declared edge, in spec order of source then target (the mermaid diagram's order).
edges_of = diagrams.ordered_edges


def _ranks(policy: EntityPolicy) -> dict[str, int]:
    states = list(policy.states)
    back: set[tuple[str, str]] = set()
    seen: set[str] = set()
    on_stack: set[str] = set()

    def visit(state: str) -> None:
        seen.add(state)
        on_stack.add(state)
        for target in states:
            if target == state or target not in policy.edges.get(state, frozenset()):
                continue
            if target in on_stack:
                back.add((state, target))
            elif target not in seen:
                visit(target)
        on_stack.discard(state)

    for start in [s for s in states if s in policy.initial] + states:
        if start not in seen:
            visit(start)
    forward = [(s, t) for s, t in edges_of(policy) if s != t and (s, t) not in back]
    rank = dict.fromkeys(states, 0)
    for _ in states:  # longest path over a DAG: at most |states| relaxation rounds
        changed = False
        for s, t in forward:
            if rank[t] < rank[s] + 1:
                rank[t] = rank[s] + 1
                changed = True
        if not changed:
            break
    bottom = max(rank.values(), default=0)
    for s in policy.terminal:  # every end on the last row reads like a state chart
        if s in rank:
            rank[s] = max(bottom, 1)
    return rank


def render_svg(policy: EntityPolicy, counts: Mapping[str, int] | None = None) -> str:
    """The lifecycle of ``policy`` as a standalone SVG document; with ``counts``, each
    state labelled with how many rows are in it."""
    ranks = _ranks(policy)
    rows: dict[int, list[_Node]] = {}
    nodes: dict[str, _Node] = {}
    labels = {s: s if counts is None else f"{s} · {counts.get(s, 0):,}"
              for s in policy.states}
    for state in policy.states:
        node = _Node(state, ranks[state], width=len(labels[state]) * CHAR_WIDTH + 2 * PAD_X)
        rows.setdefault(node.rank, []).append(node)
        nodes[state] = node
    widths = {r: sum(n.width for n in row) + GAP_X * (len(row) - 1) for r, row in rows.items()}
    total_width = max(widths.values(), default=100) + 2 * MARGIN + 80
    for r, row in rows.items():
        x = (total_width - widths[r]) / 2
        for n in row:
            n.x, n.y = x, MARGIN + 20 + r * RANK_GAP
            x += n.width + GAP_X
    height = MARGIN * 2 + 20 + (max(rows, default=0) + 1) * RANK_GAP
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_width:.0f}" '
           f'height="{height:.0f}" viewBox="0 0 {total_width:.0f} {height:.0f}" '
           f'font-family="sans-serif" font-size="12" role="img">',
           f"<title>{escape(policy.name)} lifecycle</title>",
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
           'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
           'fill="#555"/></marker></defs>',
           '<rect width="100%" height="100%" fill="#ffffff"/>']
    for s, t in edges_of(policy):
        a, b = nodes[s], nodes[t]
        label = edge_label(policy, s, t)
        tip = f"{s} \u2192 {t}" + (f": {label}" if label else "")
        out.append(f"<g><title>{escape(tip)}</title>")
        if s == t:
            x, y = a.x + a.width, a.y + NODE_HEIGHT / 2
            d = f"M{x - 6:.1f},{a.y:.1f} C{x + 30:.1f},{a.y - 18:.1f} {x + 30:.1f}," \
                f"{a.y + NODE_HEIGHT + 18:.1f} {x - 6:.1f},{a.y + NODE_HEIGHT:.1f}"
            del y
        elif b.rank > a.rank:
            d = (f"M{a.x + a.width / 2:.1f},{a.y + NODE_HEIGHT:.1f} "
                 f"L{b.x + b.width / 2:.1f},{b.y:.1f}")
        else:  # back or same-rank edge: a curve bowing to the side
            x1, y1 = a.x + a.width * 0.25, a.y
            x2, y2 = b.x + b.width * 0.25, b.y + (NODE_HEIGHT if b.rank < a.rank else 0)
            bow = -60 if x1 >= x2 else 60
            cx, cy = (x1 + x2) / 2 + bow, (y1 + y2) / 2 - (30 if b.rank == a.rank else 0)
            d = f"M{x1:.1f},{y1:.1f} Q{cx:.1f},{cy:.1f} {x2:.1f},{y2:.1f}"
        dash = ' stroke-dasharray="4 3"' if label else ""
        out.append(f'<path d="{d}" fill="none" stroke="#555" stroke-width="1.3"{dash} '
                   'marker-end="url(#arrow)"/></g>')
    for n in nodes.values():
        described = policy.states[n.name]
        out.append(f"<g><title>{escape(n.name)}: {escape(described)}</title>")
        if n.name in policy.initial:
            cx = n.x + n.width / 2
            out.append(f'<circle cx="{cx:.1f}" cy="{n.y - 16:.1f}" r="4" fill="#222"/>'
                       f'<path d="M{cx:.1f},{n.y - 12:.1f} L{cx:.1f},{n.y:.1f}" stroke="#222" '
                       'marker-end="url(#arrow)"/>')
        fill = "#eef4ff" if n.name not in policy.terminal else "#f3f3f3"
        out.append(f'<rect x="{n.x:.1f}" y="{n.y:.1f}" width="{n.width:.1f}" '
                   f'height="{NODE_HEIGHT}" rx="8" fill="{fill}" stroke="#335"/>')
        if n.name in policy.terminal:
            out.append(f'<rect x="{n.x + 3:.1f}" y="{n.y + 3:.1f}" width="{n.width - 6:.1f}" '
                       f'height="{NODE_HEIGHT - 6}" rx="6" fill="none" stroke="#335"/>')
        out.append(f'<text x="{n.x + n.width / 2:.1f}" y="{n.y + NODE_HEIGHT / 2 + 4:.1f}" '
                   f'text-anchor="middle" fill="#112">{escape(labels[n.name])}</text></g>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


__all__ = ["edge_label", "edges_of", "render_svg"]
