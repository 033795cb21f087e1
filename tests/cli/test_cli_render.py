"""The command colours a status by what its spec says it means, not by a list of names."""

from __future__ import annotations

from pathlib import Path

from ledgerq.cli.render import ENDED_STYLE, LIVE_STYLE, status_style, styled_status
from ledgerq.lifecycle import default_registry, load_registry

SPEC = """\
entity = "widget"
table = "widgets"
initial = ["new"]
terminal = ["shipped", "scrapped", "shelved", "gone"]

[states.new]
description = "Just made."
[states.shipped]
description = "Out of the door."
outcome = "succeeded"
[states.scrapped]
description = "Broken."
outcome = "failed"
[states.shelved]
description = "Not wanted after all."
outcome = "skipped"
[states.gone]
description = "Nobody knows."

[[edges]]
from = "new"
to = ["shipped", "scrapped", "shelved", "gone"]

[reason_codes]
"widget.new.created" = "Created."
"""


def test_packaged_run_statuses() -> None:
    run = default_registry().entity("schedule_run")
    assert {s: status_style(run, s) for s in run.states} == {
        "queued": LIVE_STYLE, "waiting_dependency": LIVE_STYLE, "running": LIVE_STYLE,
        "retry_wait": LIVE_STYLE, "delayed": LIVE_STYLE, "completed": "green", "failed": "red",
        "timed_out": "red",
        "skipped": "dim", "cancelled": "yellow",
    }


def test_a_new_state_is_coloured_by_its_outcome(tmp_path: Path) -> None:
    (tmp_path / "widget.toml").write_text(SPEC)
    widget = load_registry(tmp_path).entity("widget")
    assert [status_style(widget, s) for s in ("new", "shipped", "scrapped", "shelved")] == [
        LIVE_STYLE, "green", "red", "dim"]
    assert status_style(widget, "gone") == ENDED_STYLE  # an end without a declared outcome
    # A status the loaded specs do not know (a newer spec wrote it), or none at all: plain.
    assert status_style(widget, "on_hold") == status_style(widget, None) == ""
    text = styled_status(widget, "shipped")
    assert (text.plain, str(text.style)) == ("shipped", "green")
    assert styled_status(widget, None).plain == ""
