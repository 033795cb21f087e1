"""How the command shows things: one escaping rule for every human-readable value, one
JSON writer for every ``--json``.

Kept in one module so a new command cannot print a stored value without the escaping
(a run's args or error detail may hold terminal escape sequences).
"""

from __future__ import annotations

import json
import os
import re
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

if TYPE_CHECKING:
    from ledgerq.lifecycle.registry import EntityPolicy

#: Off a terminal rich assumes 80 columns and squeezes tables; give them room instead.
_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200
#: emoji=False: a stored ":smile:" is shown as typed (values go in as Text, never markup).
out = Console(highlight=False, width=_WIDTH, emoji=False)
err_console = Console(stderr=True, highlight=False, emoji=False)

#: A terminal state's colour, by the outcome its spec declares (the registry's closed
#: vocabulary): a state added to a spec is coloured by what it means, with no edit here.
OUTCOME_STYLE = {"succeeded": "green", "failed": "red", "cancelled": "yellow", "skipped": "dim"}
#: A state a row has not ended in: still waiting or working.
LIVE_STYLE = "cyan"
#: A terminal state that declares no outcome: ended, meaning unknown.
ENDED_STYLE = "bold"

JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


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


def printable_text(value: str) -> str:
    """Multi-line text (a run's output) shown literally: like :func:`printable`, but its
    newlines and tabs stay what they are, so the output reads as the task wrote it."""
    return "\n".join("\t".join(printable(part) for part in line.split("\t"))
                     for line in value.split("\n"))


def cell(value: object, style: str = "") -> Text:
    """A value for a rich table or print: escaped, and a Text, so "[red]" is never markup."""
    return Text(printable(value), style=style)


def status_style(policy: EntityPolicy, status: str | None) -> str:
    """A status's colour, from the spec: its outcome when it is an end, else "live". A
    state the loaded specs do not declare (written by a newer spec) stays plain."""
    if status is None or status not in policy.states:
        return ""
    if status in policy.terminal:
        return OUTCOME_STYLE.get(policy.outcome(status) or "", ENDED_STYLE)
    return LIVE_STYLE


def styled_status(policy: EntityPolicy, status: str | None) -> Text:
    return cell(status or "", status_style(policy, status))


def emit_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")


def fmt_ts(ts: float | None) -> str:
    """Local wall-clock time of epoch seconds; a value no calendar holds (written around
    the bounds every boundary checks) is shown as the number it is, never a traceback."""
    if ts is None:
        return ""
    try:
        return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, ValueError, OSError, TypeError):
        return f"{ts!r} (not a time)"


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
