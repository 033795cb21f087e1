"""The durable task queue, in wings: ``submission`` (validated, idempotent, with its
creation fact), ``worker`` (claims under leases, supervision, outcomes, the Worker
service), ``maintenance`` (the reaper, promotion of due runs, stuck rows, archiving),
``scheduling`` (schedules and their slots); ``moves`` names every move the queue makes
and ``reads`` its read models. The public names are re-exported here."""

from ledgerq.queue.capabilities import (
    CAPABILITY_CLASSES,
    DEFAULT_CAPABILITY_CLASS,
    affinity_score,
    host_scoped_concurrency_key,
    worker_can_serve,
)
from ledgerq.queue.reads import (
    QueueStats,
    RunPage,
    get_run,
    list_runs,
    queue_stats,
    resolve_run_id,
    run_history,
    wait_for_runs,
)
from ledgerq.queue.scheduling.scheduler import FirePass, fire_due
from ledgerq.queue.scheduling.schedules import (
    add_schedule,
    get_schedule,
    list_schedules,
    pause_schedule,
    resume_schedule,
    retire_schedule,
)
from ledgerq.queue.submission.application import (
    ACTION_ALIASES,
    ACTION_KINDS,
    EXECUTION_TARGETS,
    RetryPolicy,
    SubmitLimits,
    TaskApplication,
)
from ledgerq.queue.submission.rerun import retry_run, retry_runs
from ledgerq.queue.submission.submit import (
    cancel_task,
    record_scheduled_fire,
    submit_many,
    submit_task,
)
from ledgerq.queue.worker.functions import (
    DEFAULT_HEARTBEAT_TTL_SECONDS,
    DEFAULT_LEASE_TTL_SECONDS,
    MAX_LEASE_ATTEMPTS,
    claim_and_execute,
    claim_runs,
    promote_due,
    reap_expired_leases,
    register_heartbeat,
    worker_tick,
)
from ledgerq.queue.worker.launcher import (
    ExecuteFn,
    build_argv,
    default_execute,
    make_default_execute,
)
from ledgerq.queue.worker.service import Worker

__all__ = [
    "ACTION_ALIASES",
    "ACTION_KINDS",
    "CAPABILITY_CLASSES",
    "DEFAULT_CAPABILITY_CLASS",
    "DEFAULT_HEARTBEAT_TTL_SECONDS",
    "DEFAULT_LEASE_TTL_SECONDS",
    "EXECUTION_TARGETS",
    "MAX_LEASE_ATTEMPTS",
    "ExecuteFn",
    "FirePass",
    "QueueStats",
    "RetryPolicy",
    "RunPage",
    "SubmitLimits",
    "TaskApplication",
    "Worker",
    "add_schedule",
    "affinity_score",
    "build_argv",
    "cancel_task",
    "claim_and_execute",
    "claim_runs",
    "default_execute",
    "fire_due",
    "get_run",
    "get_schedule",
    "host_scoped_concurrency_key",
    "list_runs",
    "list_schedules",
    "make_default_execute",
    "pause_schedule",
    "promote_due",
    "queue_stats",
    "reap_expired_leases",
    "record_scheduled_fire",
    "register_heartbeat",
    "resolve_run_id",
    "resume_schedule",
    "retire_schedule",
    "retry_run",
    "retry_runs",
    "run_history",
    "submit_many",
    "submit_task",
    "wait_for_runs",
    "worker_can_serve",
    "worker_tick",
]
