"""Every move the queue itself performs, named once, the run columns and groups it relies
on, and the check that the specs allow them.

The spec decides which edges exist; the queue's code decides which of them it takes, with
which reason code. Those choices live here, in one table, so that a spec directory that
drops an edge, a reason code, a lease column or a terminal state's outcome the queue
relies on is refused when it is loaded (:func:`check`), naming what is missing, instead of
failing at the first claim or the first exit code hours later.

A leaf: it imports nothing of the queue, so the command, the queue's entry points and
(through a one-line hook) ``StateDB`` can all run the check without an import cycle.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ledgerq.lifecycle.naming import name_entity, name_states
from ledgerq.lifecycle.registry import OUTCOMES, SUCCEEDED, EntityPolicy, Registry
from ledgerq.lifecycle.spec import SpecError, SpecProblem

#: The entity the queue runs.
ENTITY = "schedule_run"
#: The entity ledgerq's scheduler fires from (optional: specs without it have no scheduler).
SCHEDULE_ENTITY = "schedule"
#: The run spec's column group that makes a lease (``[column_groups] lease = [...]``:
#: cleared on requeue, guarded on by renewals and terminal writes, read by lease checks
#: and the reaper).
LEASE = "lease"
#: What a claim pass reads of a candidate.
CANDIDATE_COLUMNS = ("id", "queued_at", "required_capabilities", "execution_target",
                     "concurrency_key", "lease_attempts", "priority", "queue")
#: The claim order's columns (specs that predate them: every run is priority 0 in the
#: default queue).
PRIORITY_COLUMN = "priority"
QUEUE_COLUMN = "queue"
#: The queue a run waits in, and a worker serves, when none is named.
DEFAULT_QUEUE = "default"
#: The run column a fire of ledgerq's scheduler records its slot in (``schedule_run.toml``).
SLOT_COLUMN = "slot_at"
#: The run columns a Python task's end fills: its return value, and its exception (type,
#: message, traceback). Specs that predate them record neither.
RESULT_COLUMN = "result"
ERROR_COLUMN = "error"
#: A move's source meaning "whatever state the row is in, if the spec allows the edge".
ANY = "*"


def lease_columns(policy: EntityPolicy) -> tuple[str, ...]:
    """What a lease check reads of a run: its status and its lease, as the spec groups it."""
    return ("id", "status", *policy.column_group(LEASE))


def expired_columns(policy: EntityPolicy) -> tuple[str, ...]:
    """What the reaper reads of an expired lease: the lease, and how often it expired."""
    return ("id", *policy.column_group(LEASE), "lease_attempts")


@dataclass(frozen=True, slots=True)
class Move:
    """One move the queue performs: from ``source`` to ``target`` with reason ``code``."""

    source: str | None
    """None: the row is created in ``target`` (an initial state); :data:`ANY`: from any
    state with a declared edge to ``target``."""
    target: str
    code: str
    #: What the move is for, in the words a spec author reads in a refusal.
    purpose: str
    #: None: the queue always needs the move. A state: the move belongs to the feature
    #: that state stands for (retries, dependencies); specs without the state are an older
    #: version that lacks the feature, and the move is required once the state is declared.
    #: A reason code: the same for a feature that is a code alone (an operator's retry
    #: creates a run in a state every release has; only its reason is new).
    feature: str | None = None

    def offered_by(self, policy: EntityPolicy) -> bool:
        """Whether the loaded specs have this move's feature (always, for a core move)."""
        return self.feature is None or self.feature in policy.states \
            or self.feature in policy.reason_codes

    def __str__(self) -> str:
        src = "(created)" if self.source is None else self.source
        return f"{src} -> {self.target} ({self.code})"


SUBMITTED = Move(None, "queued", "run.queued.submitted", "a submitted run")
SUBMITTED_WAITING = Move(None, "waiting_dependency", "run.waiting_dependency.submitted",
                         "a submitted run with dependencies", feature="waiting_dependency")
DEPENDENCIES_MET = Move("waiting_dependency", "queued", "run.queued.dependencies_met",
                        "releasing a run whose dependencies succeeded",
                        feature="waiting_dependency")
DEPENDENCY_FAILED = Move("waiting_dependency", "cancelled", "run.cancelled.dependency_failed",
                         "cancelling a run whose dependency did not succeed",
                         feature="waiting_dependency")
CLAIM = Move("queued", "running", "run.started.ok", "a worker's claim")
RENEWED = Move("running", "running", "run.running.lease_renewed", "a lease renewal")
#: The exit-0 move: its target's outcome must be ``succeeded`` (checked), so the state a
#: run ends in and what its dependents count as met cannot disagree.
EXITED_ZERO = Move("running", "completed", "run.completed.ok", "a run that exited 0")
EXITED_NONZERO = Move("running", "failed", "run.failed.exit_nonzero",
                      "a run that exited non-zero")
RAISED = Move("running", "failed", "run.failed.exception",
              "a run whose executor raised or could not start")
UNAUTHORIZED = Move("running", "failed", "run.failed.unauthorized",
                    "a run the authorize hook denied")
TIMED_OUT = Move("running", "timed_out", "run.timed_out.deadline",
                 "a run killed at its deadline")
SHUTDOWN = Move("running", "queued", "run.queued.worker_shutdown",
                "a run given back by a stopping worker")
BACKOFF = Move("running", "retry_wait", "run.retry_wait.backoff",
               "a failed run with retries left", feature="retry_wait")
RETRY_DUE = Move("retry_wait", "queued", "run.queued.retry_due", "a retry whose delay elapsed",
                 feature="retry_wait")
SUBMITTED_DELAYED = Move(None, "delayed", "run.delayed.submitted",
                         "a submitted run whose start time is still to come", feature="delayed")
START_DUE = Move("delayed", "queued", "run.queued.not_before",
                 "a delayed run whose start time came", feature="delayed")
#: A run its worker could not start for want of a resource of its own (file descriptors,
#: memory): not the task's failure (see queue/worker/starvation.py). Specs without the
#: code give it back as a shutdown does.
STARVED = Move("running", "queued", "run.queued.worker_starved",
               "a run given back by a worker out of a resource",
               feature="run.queued.worker_starved")
LEASE_EXPIRED = Move("running", "queued", "run.queued.lease_expired",
                     "the reaper's requeue of an expired lease")
LEASES_EXHAUSTED = Move("running", "failed", "run.failed.lease_attempts_exhausted",
                        "the reaper failing a run whose lease expired too often")
CANCELLED = Move(ANY, "cancelled", "run.cancelled.operator", "an operator's cancel")
#: Run again: a new run, created from an ended run's application (which stays as it
#: ended); its creation fact names the original.
RETRIED = Move(None, "queued", "run.queued.retried", "a new run of an ended run's application",
               feature="run.queued.retried")

#: The table: every move above.
MOVES: tuple[Move, ...] = (
    SUBMITTED, SUBMITTED_WAITING, DEPENDENCIES_MET, DEPENDENCY_FAILED, CLAIM, RENEWED,
    EXITED_ZERO, EXITED_NONZERO, RAISED, UNAUTHORIZED, TIMED_OUT, SHUTDOWN, BACKOFF,
    RETRY_DUE, SUBMITTED_DELAYED, START_DUE, LEASE_EXPIRED, LEASES_EXHAUSTED, CANCELLED,
    RETRIED, STARVED,
)

#: The states the store's queries select runs by, under the names the queries give them
#: (``WHERE status = {queued}``): the moves' own states, so renaming a state renames it
#: here and in the spec, and in no SQL (:mod:`ledgerq.lifecycle.naming`).
QUERIED_STATES = {"queued": SUBMITTED.target, "running": CLAIM.target,
                  "retry_wait": BACKOFF.target, "delayed": SUBMITTED_DELAYED.target,
                  "waiting_dependency": SUBMITTED_WAITING.target}
name_states(ENTITY, QUERIED_STATES)
name_entity("runs", ENTITY)

# The scheduler's moves of runs: required once the specs declare the schedule entity.
FIRED = Move(None, "queued", "run.queued.scheduled", "a schedule's fire of one slot")
OVERLAP_SKIPPED = Move(None, "skipped", "run.skipped.overlap",
                       "a slot not run because the schedule's previous fire had not ended")
SCHEDULER_MOVES: tuple[Move, ...] = (FIRED, OVERLAP_SKIPPED)

# An external scheduler's fires (``record_scheduled_fire``): a row created straight in
# the state its fire ended in, each with its own code. Optional, each by its code: specs
# that do not declare one offer no such fire.
EXTERNAL_FIRES: tuple[Move, ...] = (
    Move(None, "running", "run.started.scheduled", "an external scheduler's fire",
         feature="run.started.scheduled"),
    Move(None, "queued", "run.queued.scheduled", "an external scheduler's queued fire",
         feature="run.queued.scheduled"),
    Move(None, "failed", "run.failed.scheduled", "an external scheduler's failed fire",
         feature="run.failed.scheduled"),
    Move(None, "skipped", "run.skipped.scheduled", "an external scheduler's skipped fire",
         feature="run.skipped.scheduled"),
)

# The schedule entity's own moves (``ledgerq schedule add|pause|resume|rm``).
SCHEDULE_ADDED = Move(None, "active", "schedule.active.created", "adding a schedule")
SCHEDULE_ADDED_PAUSED = Move(None, "paused", "schedule.paused.created",
                             "adding a paused schedule")
SCHEDULE_PAUSED = Move("active", "paused", "schedule.paused.operator", "pausing a schedule")
SCHEDULE_RESUMED = Move("paused", "active", "schedule.active.resumed", "resuming a schedule")
SCHEDULE_RETIRED = Move(ANY, "retired", "schedule.retired.operator", "retiring a schedule")
SCHEDULE_MOVES: tuple[Move, ...] = (SCHEDULE_ADDED, SCHEDULE_ADDED_PAUSED, SCHEDULE_PAUSED,
                                    SCHEDULE_RESUMED, SCHEDULE_RETIRED)
#: The state the scheduler fires from (a schedule in any other fires nothing).
FIRING = SCHEDULE_ADDED.target


def move_problems(policy: EntityPolicy, moves: tuple[Move, ...]) -> list[SpecProblem]:
    """The states, edges, reason codes and initial states ``moves`` need and ``policy``
    lacks, one finding each."""
    problems: list[SpecProblem] = []

    def bad(where: str, what: str) -> None:
        problems.append(SpecProblem(policy.source, where, what))

    wanted = [m for m in moves if m.offered_by(policy)]
    # One finding per missing state or edge, naming every move that needs it.
    states: dict[str, list[Move]] = {}
    edges: dict[tuple[str, str], list[Move]] = {}
    for m in wanted:
        for state in (m.source, m.target):
            if state not in (None, ANY) and state not in policy.states:
                states.setdefault(state, []).append(m)
        if m.source not in (None, ANY) and m.source in policy.states \
                and m.target in policy.states and not policy.allows(m.source, m.target):
            edges.setdefault((m.source, m.target), []).append(m)
    for state, needing in states.items():
        bad("$.states", f"state {state!r} is not declared; the queue needs it for "
            f"{_uses(needing)}")
    for (src, dst), needing in edges.items():
        bad("$.edges", f"edge {src} -> {dst} is not declared; the queue needs it for "
            f"{_uses(needing)}")
    for m in wanted:
        if m.code not in policy.reason_codes:
            bad("$.reason_codes", f"reason code {m.code!r} is not declared; the queue writes "
                f"it for {m.purpose} ({m})")
        if m.source is None and m.target in policy.states and m.target not in policy.initial:
            bad("$.initial", f"state {m.target!r} is not initial; the queue creates rows "
                f"there for {m.purpose}")
    return problems


def policy_problems(policy: EntityPolicy, *, scheduled: bool = False) -> list[SpecProblem]:
    """What the queue needs of the run entity's spec and ``policy`` lacks, one finding each;
    ``scheduled``: the specs declare schedules, so the scheduler's needs count too."""
    problems = move_problems(policy, MOVES + (SCHEDULER_MOVES if scheduled else ()))

    def bad(where: str, what: str) -> None:
        problems.append(SpecProblem(policy.source, where, what))

    if scheduled:
        slot_key = ("schedule_id", SLOT_COLUMN)
        if SLOT_COLUMN not in policy.columns:
            bad("$.columns", f"no column {SLOT_COLUMN!r}; the scheduler records the slot "
                "of each fire there")
        elif not any(ix.unique and ix.columns == slot_key for ix in policy.indexes):
            bad("$.indexes", f"no unique index on {', '.join(slot_key)}; it is what makes "
                "each slot of a schedule fire exactly once")
    for state in sorted(policy.terminal):
        if policy.outcome(state) is None:
            bad(f"$.states.{state}", f"terminal state {state!r} declares no outcome; the "
                f"queue needs one to settle the runs that depend on it (outcome = one of "
                f"{', '.join(OUTCOMES)})")
    done = EXITED_ZERO.target
    if done in policy.terminal and policy.outcome(done) not in (None, SUCCEEDED):
        bad(f"$.states.{done}.outcome", f"the queue ends a run that exited 0 in {done!r}, "
            f"so its outcome must be {SUCCEEDED!r}, not {policy.outcome(done)!r}")
    elif done in policy.states and done not in policy.terminal:
        bad("$.terminal", f"state {done!r} is not terminal; the queue ends a run that "
            f"exited 0 there")
    if LEASE not in policy.column_groups:
        bad("$.column_groups", f"no column group {LEASE!r}; the queue clears, guards on and "
            f"reads a run's lease as that group")
    else:
        for col in policy.column_group(LEASE):
            for allowlist, name in ((policy.guard_columns, "guard_columns"),
                                    (policy.patch_columns, "patch_columns")):
                if col not in allowlist:
                    bad(f"$.column_groups.{LEASE}", f"lease column {col!r} is not in "
                        f"{name}; the queue guards on and clears the whole lease")
    return problems


def _uses(needing: list[Move]) -> str:
    return "; ".join(f"{m.purpose} ({m.code})" for m in needing)


def problems(registry: Registry) -> list[SpecProblem]:
    """Every finding of :func:`policy_problems` (and, when the specs declare schedules, of
    the schedule entity's moves); none when the registry has no run entity (a registry for
    the engine alone, with no queue on top)."""
    deferring = on_enter_problems(registry)
    if ENTITY not in registry.entities:
        return deferring
    scheduled = SCHEDULE_ENTITY in registry.entities
    found = policy_problems(registry.entity(ENTITY), scheduled=scheduled)
    if scheduled:
        found += move_problems(registry.entity(SCHEDULE_ENTITY), SCHEDULE_MOVES)
    return found + deferring


def on_enter_problems(registry: Registry) -> list[SpecProblem]:
    """Tasks states defer (``on_enter``) that the queue could not run: a name no task can
    have, specs without the run entity to queue them in, or a run entity's own state
    (each run entering it would defer another run, without end)."""
    # (Imported here: submission's application module is built on this one.)
    from ledgerq.queue.submission.application import task_name_problem

    found: list[SpecProblem] = []
    for policy in registry.policies():
        for state, tasks in policy.on_enter.items():
            where = f"$.states.{state}.on_enter"

            def bad(message: str, where: str = where, policy: EntityPolicy = policy) -> None:
                found.append(SpecProblem(policy.source, where, message))

            if policy.name == ENTITY:
                bad(f"a {ENTITY} state cannot defer tasks: every run entering it would "
                    "defer another run")
                continue
            if ENTITY not in registry.entities:
                bad(f"state {state!r} defers tasks, but the specs have no {ENTITY!r} "
                    "entity to queue them in")
            for task in tasks:
                problem = task_name_problem(task)
                if problem is not None:
                    bad(f"task name {problem}")
    return found


@functools.lru_cache(maxsize=16)
def _checked(registry: Registry) -> tuple[SpecProblem, ...]:
    # Registries are immutable and compared by identity: one check per registry.
    return tuple(problems(registry))


def check(registry: Registry) -> Registry:
    """Raise SpecError naming every move, reason code, outcome or lease column the queue
    needs and ``registry`` lacks; else return it. Cheap after the first call per registry."""
    found = _checked(registry)
    if found:
        raise SpecError(found)
    return registry
