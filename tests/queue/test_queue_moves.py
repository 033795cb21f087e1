"""The queue's own moves (queue/moves.py) against the specs: a spec set that lacks one is
refused when it is loaded, naming it; outcomes, not state names, decide what a dependency
counts as."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerq import StateDB
from ledgerq.lifecycle import (
    Actor,
    Registry,
    SpecError,
    StateReason,
    TransitionRequest,
    default_registry,
    load_registry,
    transition,
)
from ledgerq.lifecycle.registry import packaged_specs_dir
from ledgerq.queue import (
    RetryPolicy,
    TaskApplication,
    Worker,
    claim_runs,
    moves,
    promote_due,
    submit_task,
)
from ledgerq.queue.worker.functions import Executors, RunContext, execute_claimed

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_000_000.0
RUNNING_END = 'from = "running"\nto = ["completed", "failed", "timed_out", "cancelled"]'
RUNNING_BACK = 'from = "running"\nto = ["retry_wait", "queued"]'


def spec_dir(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    """The packaged specs, with each (old, new) replaced once in schedule_run.toml."""
    out = tmp_path / "specs"
    shutil.copytree(packaged_specs_dir(), out)
    f = out / "schedule_run.toml"
    text = f.read_text()
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    f.write_text(text)
    return out


def without_requeue(tmp_path: Path) -> Path:
    """Valid on its own (queued stays reachable), but the queue requeues running runs."""
    return spec_dir(tmp_path, (RUNNING_BACK, RUNNING_BACK.replace(', "queued"', "")))


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerq", *map(str, args)],
                          capture_output=True, text=True, timeout=60, check=False)


def app() -> TaskApplication:
    return TaskApplication("command", {"argv": ["true"]}, "host")


# ---------------------------------------------------------------- the table


def test_the_packaged_specs_allow_every_move_the_queue_makes() -> None:
    assert moves.problems(default_registry()) == []
    assert moves.check(default_registry()) is default_registry()
    policy = default_registry().entity(moves.ENTITY)
    for m in moves.MOVES:
        assert m.code in policy.reason_codes, m
        if m.source not in (None, moves.ANY):
            assert policy.allows(m.source, m.target), m
    # Each move named once: one reason code per move.
    assert len({m.code for m in moves.MOVES}) == len(moves.MOVES)


def test_a_registry_without_the_run_entity_is_not_the_queues_business() -> None:
    dispatch_only = load_registry(ROOT / "docs" / "examples" / "dispatch.toml",
                                  packaged=False)
    assert moves.problems(dispatch_only) == []
    assert moves.check(dispatch_only) is dispatch_only


def test_a_missing_edge_is_refused_naming_it_and_every_move_that_needs_it(
        tmp_path: Path) -> None:
    registry = load_registry(without_requeue(tmp_path))  # valid as a spec set
    with pytest.raises(SpecError) as info:
        moves.check(registry)
    (problem,) = info.value.problems
    assert problem.file == str(tmp_path / "specs" / "schedule_run.toml")
    assert problem.path == "$.edges"
    assert problem.message.startswith("edge running -> queued is not declared; the queue "
                                      "needs it for ")
    assert "run.queued.worker_shutdown" in problem.message
    assert "run.queued.lease_expired" in problem.message
    assert str(info.value) == f"{problem.file}: $.edges: {problem.message}"


REFUSED = [
    # (edits to schedule_run.toml, $-path, fragment of the message)
    ([('[states.completed]\ndescription = "Finished with exit code zero."\noutcome = '
       '"succeeded"', '[states.completed]\ndescription = "Finished with exit code zero."\n'
       'outcome = "failed"')],
     "$.states.completed.outcome", "its outcome must be 'succeeded', not 'failed'"),
    ([('outcome = "failed"\n[states.skipped]', '[states.skipped]')],
     "$.states.timed_out", "terminal state 'timed_out' declares no outcome"),
    ([('"run.queued.lease_expired" = "Its lease expired; returned to the queue by the '
       'reaper."\n', "")],
     "$.reason_codes", "reason code 'run.queued.lease_expired' is not declared"),
    ([('[column_groups]\nlease = ["leased_by", "lease_expires_at", "lease_token"]\n', ""),
      ('clears = ["lease"]\n', "")],
     "$.column_groups", "no column group 'lease'"),
    ([('"leased_by", "lease_expires_at", "lease_token", "lease_attempts", "run_attempts", '
       '"retry_due_at",', '"leased_by", "lease_expires_at", "lease_attempts", "run_attempts", '
       '"retry_due_at",')],
     "$.column_groups.lease", "lease column 'lease_token' is not in guard_columns"),
    # A feature the specs declare (retries) must be whole.
    ([('from = "retry_wait"\nto = ["queued", "cancelled"]',
       'from = "retry_wait"\nto = ["cancelled"]')],
     "$.edges", "edge retry_wait -> queued is not declared"),
]


@pytest.mark.parametrize(("edits", "path", "fragment"), REFUSED,
                         ids=["exit0-outcome", "no-outcome", "reason-code", "no-lease-group",
                              "lease-not-guardable", "half-a-feature"])
def test_what_the_queue_needs_is_refused_naming_it(tmp_path: Path, edits: list[tuple[str, str]],
                                                  path: str, fragment: str) -> None:
    registry = load_registry(spec_dir(tmp_path, *edits))
    with pytest.raises(SpecError) as info:
        moves.check(registry)
    (problem,) = info.value.problems
    assert (problem.path, problem.file) == (path, str(tmp_path / "specs" / "schedule_run.toml"))
    assert fragment in problem.message, problem


def test_older_specs_without_a_feature_state_are_accepted(tmp_path: Path) -> None:
    """Specs without retry_wait are an older version (docs/specs.md): the queue
    leaves retries out rather than refusing them."""
    older = spec_dir(
        tmp_path,
        ('[states.retry_wait]\ndescription = "Failed with retries left; becomes queued again '
         'at retry_due_at."\n', ""),
        (RUNNING_BACK, RUNNING_BACK.replace('"retry_wait", ', "")),
        ('[[edges]]\nfrom = "retry_wait"\nto = ["queued", "cancelled"]\n', ""),
        ('[[indexes]]\nname = "idx_schedule_runs_retry_due"\ncolumns = ["retry_due_at"]\n'
         'where_status = ["retry_wait"]\n', ""),
        ('where_status = ["queued", "running", "retry_wait"]', 'where_status = ["queued", '
         '"running"]'))
    registry = load_registry(older)
    assert moves.check(registry) is registry
    assert not moves.BACKOFF.offered_by(registry.entity(moves.ENTITY))


async def test_a_failed_run_with_retries_left_fails_plainly_under_specs_without_retries(
        tmp_path: Path) -> None:
    older = spec_dir(
        tmp_path,
        ('[states.retry_wait]\ndescription = "Failed with retries left; becomes queued again '
         'at retry_due_at."\n', ""),
        (RUNNING_BACK, RUNNING_BACK.replace('"retry_wait", ', "")),
        ('[[edges]]\nfrom = "retry_wait"\nto = ["queued", "cancelled"]\n', ""),
        ('[[indexes]]\nname = "idx_schedule_runs_retry_due"\ncolumns = ["retry_due_at"]\n'
         'where_status = ["retry_wait"]\n', ""),
        ('where_status = ["queued", "running", "retry_wait"]', 'where_status = ["queued", '
         '"running"]'))
    async with StateDB(tmp_path / "state.db", registry=load_registry(older)) as db:
        rid = await submit_task(db, TaskApplication(
            "command", {"argv": ["false"]}, "host", retry=RetryPolicy(3, 1.0)), now=NOW)
        (run,) = (await claim_runs(db, worker_id="w", now=NOW)).claimed

        async def fails(_: dict[str, object]) -> tuple[int, str]:
            return 1, "boom"

        ctx = RunContext(worker_id="w", clock=lambda: NOW + 1,
                         executors=Executors(execute=fails))
        assert await execute_claimed(db, run, ctx) == "failed"
        row = await db.fetch_one("SELECT status, exit_code FROM schedule_runs WHERE id = ?",
                                 (rid,))
        assert row == {"status": "failed", "exit_code": 1}


# ---------------------------------------------------------------- refused when loaded


def test_specs_check_reports_the_missing_edge(tmp_path: Path) -> None:
    specs = without_requeue(tmp_path)
    res = cli("specs", "check", "--specs", specs)
    assert res.returncode == 1, res
    (line,) = res.stdout.strip().splitlines()
    assert line.startswith(f"{specs / 'schedule_run.toml'}: $.edges: edge running -> queued "
                           "is not declared")
    assert "1 problem(s)" in res.stderr
    report = json.loads(cli("specs", "check", specs, "--json").stdout)
    assert report["ok"] is False
    assert [(p["path"], p["message"].split(";")[0]) for p in report["problems"]] == [
        ("$.edges", "edge running -> queued is not declared")]
    # Every command given the spec set refuses it the same way, before touching a database.
    db = tmp_path / "never.db"
    res = cli("--specs", specs, "submit", "--db", db, "command", "--", "true")
    assert res.returncode == 1 and "specs check" in res.stderr, res
    assert not db.exists()


async def test_queue_entry_points_refuse_the_registry_before_writing(tmp_path: Path) -> None:
    registry = load_registry(without_requeue(tmp_path))
    async with StateDB(tmp_path / "state.db", registry=registry) as db:
        for attempt in (lambda: submit_task(db, app(), now=NOW),
                        lambda: claim_runs(db, worker_id="w", now=NOW),
                        lambda: promote_due(db, now=NOW)):
            with pytest.raises(SpecError, match="edge running -> queued is not declared"):
                await attempt()
        with pytest.raises(SpecError, match="edge running -> queued is not declared"):
            Worker(db, handle_signals=False)
        assert await db.fetch_one("SELECT COUNT(*) AS n FROM status_transitions") == {"n": 0}


# ---------------------------------------------------------------- outcomes settle dependents


def with_other_ends(tmp_path: Path) -> Registry:
    """Two more ends of a run: one that counts as success, one that does not."""
    return load_registry(spec_dir(
        tmp_path,
        ('[states.cancelled]', '[states.superseded]\ndescription = "Replaced; as good as '
         'done."\noutcome = "succeeded"\n[states.discarded]\ndescription = "Thrown away."\n'
         'outcome = "failed"\n[states.cancelled]'),
        ('terminal = ["completed",', 'terminal = ["superseded", "discarded", "completed",'),
        (RUNNING_END, RUNNING_END.replace('"cancelled"]', '"cancelled", "superseded", '
                                          '"discarded"]')),
        ('[reason_codes]\n', '[reason_codes]\n"run.superseded.ok" = "Replaced."\n'
         '"run.discarded.ok" = "Thrown away."\n')))


async def test_a_dependency_is_met_by_its_states_outcome(tmp_path: Path,
                                                         db_target: str) -> None:
    """The dependency sweep (SQL finds the settled, Python moves them) releases a dependent
    of a run that ended in a state whose outcome is succeeded, whatever its name, and
    cancels one of a run that ended in any other outcome."""
    registry = with_other_ends(tmp_path)
    assert moves.check(registry) is registry
    async with StateDB(db_target, registry=registry) as db:
        good, bad = [await submit_task(db, app(), now=NOW) for _ in range(2)]
        after_good = await submit_task(db, TaskApplication(
            "command", {"argv": ["true"]}, "host", depends_on=(good,)), now=NOW)
        after_bad = await submit_task(db, TaskApplication(
            "command", {"argv": ["true"]}, "host", depends_on=(bad,)), now=NOW)
        claimed = (await claim_runs(db, worker_id="w", now=NOW, limit=2)).claimed
        assert {r["id"] for r in claimed} == {good, bad}
        for rid, end in ((good, "superseded"), (bad, "discarded")):
            # Straight through the engine: nothing settles the dependents on the way.
            await transition(db, TransitionRequest(
                entity_type="schedule_run", entity_id=rid, from_state="running", to_state=end,
                reason=StateReason(code=f"run.{end}.ok"), actor=Actor(type="operator", id="a"),
                idempotency_key=f"end-{rid}"))
        got = await promote_due(db, now=NOW + 1)
        assert (got["released"], got["cancelled"]) == (1, 1)
        rows = {r["id"]: r["status"] for r in await db.fetch_all(
            "SELECT id, status FROM schedule_runs")}
        assert (rows[after_good], rows[after_bad]) == ("queued", "cancelled")


def test_the_store_names_the_queues_run_entity_as_the_queue_does() -> None:
    """The store renders the workers table's reference to the runs' table and cannot
    import the queue: the entity it is told is the runs' is the queue's."""
    from ledgerq.lifecycle.naming import named_entity
    from ledgerq.queue import moves

    assert named_entity("runs") == moves.ENTITY
