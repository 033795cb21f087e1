"""The kit can fail: bugs planted behind the library's back are each reported, with a
shrunk example.

A plant behind the library's back is a rule added to the packaged outbox's generated
machine, as a user adds rules; a bug in the engine is a patch for the whole run. The
machine must fail with an AssertionError whose example is a handful of steps (naming the
plant, or the rule that caught the bug).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule, run_state_machine_as_test

from ledgerq.lifecycle.entities import Entity
from ledgerq.testing import LifecycleMachine
from lifecycle_support import with_dispatch

#: One bug shrunk, and no "explain" phase (it reruns the failing example many times):
#: what docs/testing.md suggests for a machine that fails slowly.
SETTINGS = settings(max_examples=200, stateful_step_count=10, deadline=None, database=None,
                    report_multiple_bugs=False, suppress_health_check=list(HealthCheck),
                    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])


def reported(machine: type[LifecycleMachine], *plants: str) -> str:
    """Run ``machine``; it must fail, and the shrunk example must name one of
    ``plants`` (the planted rule, or the rules that can catch a planted bug)."""
    with pytest.raises(AssertionError) as failed:
        run_state_machine_as_test(machine, settings=SETTINGS)
    example = "\n".join(getattr(failed.value, "__notes__", []))
    assert any(f"state.{plant}(" in example for plant in plants), example
    steps = [line for line in example.splitlines() if line.startswith("state.")
             and "the_log_and_the_rows_agree" not in line and "teardown" not in line]
    # Shrunk: the first row, the moves the plant needs, the plant.
    assert len(steps) <= 5, example
    return str(failed.value)


class Outbox(LifecycleMachine.for_entity("dispatch", registry=with_dispatch())):
    """The example outbox's machine, with SQL of its own on the scratch file."""

    def sql(self, *statements: str) -> None:
        with sqlite3.connect(self.scratch.target) as conn:
            for statement in statements:
                conn.execute(statement)


def test_a_row_updated_by_raw_sql_is_reported() -> None:
    class RowUpdated(Outbox):
        @rule()
        def update_behind_its_back(self) -> None:
            self.sql("UPDATE dispatch_outbox SET attempt = attempt + 7")

    message = reported(RowUpdated, "update_behind_its_back")
    assert "column differs attempt" in message


def test_a_fact_deleted_with_the_triggers_dropped_is_reported() -> None:
    """On the example's own copy of the schema, a second connection drops the log's
    append-only triggers and deletes a row's latest fact."""

    class FactDeleted(Outbox):
        @rule(data=st.data())
        def delete_a_fact(self, data: st.DataObject) -> None:
            moved = [r for r in self.rows.values() if r.version >= 2]
            if not moved:
                return
            row = data.draw(st.sampled_from(moved))
            self.sql("DROP TRIGGER IF EXISTS status_transitions_no_delete",
                     "DROP TRIGGER IF EXISTS status_transitions_no_update",
                     f"DELETE FROM status_transitions WHERE entity_id = '{row.id}' "
                     f"AND entity_version = {row.version}")

    message = reported(FactDeleted, "delete_a_fact")
    assert "column differs" in message


def test_an_engine_that_skips_the_state_check_is_reported(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The entity handle patched to move from wherever the row is, whatever state the
    caller expects: the machine's stale moves (and races) catch it."""
    original: Callable[..., Any] = Entity._mover

    def careless(self: Entity, entity_id: str, target: Any, why: Any, actor: Any,
                 patch: Any, guard: Any, key: Any, expect: Any) -> Any:
        return original(self, entity_id, target, why, actor, patch, guard, key, None)

    monkeypatch.setattr(Entity, "_mover", careless)
    message = reported(Outbox, "stale_move", "race")
    assert "expected Conflict" in message or "a racer's legal move" in message, message


def test_a_guard_the_engine_ignores_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """The entity handle patched to drop every guard: a move guarded on a value the row
    no longer holds applies, where the machine expects Conflict (and a move that must
    name a guard is not refused)."""
    original: Callable[..., Any] = Entity._mover

    def unguarded(self: Entity, entity_id: str, target: Any, why: Any, actor: Any,
                  patch: Any, guard: Any, key: Any, expect: Any) -> Any:
        return original(self, entity_id, target, why, actor, patch, None, key, expect)

    monkeypatch.setattr(Entity, "_mover", unguarded)
    message = reported(Outbox, "stale_move", "illegal_move", "race", "legal_moves")
    # A stale guard applies (Conflict expected), a move without its required guard is
    # not refused, or one with it is (the guard dropped), whichever the shrinker found.
    assert "Conflict" in message or "MissingColumns" in message, message
