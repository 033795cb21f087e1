"""The durable task queue: submission, capabilities, worker functions and the Worker service."""

from ledgerq.queue.application import (
    ACTION_ALIASES,
    ACTION_KINDS,
    EXECUTION_TARGETS,
    RetryPolicy,
    SubmitLimits,
    TaskApplication,
)
from ledgerq.queue.capabilities import (
    CAPABILITY_CLASSES,
    DEFAULT_CAPABILITY_CLASS,
    affinity_score,
    host_scoped_concurrency_key,
    worker_can_serve,
)
from ledgerq.queue.launcher import ExecuteFn, build_argv, default_execute, make_default_execute
from ledgerq.queue.rerun import retry_run, retry_runs
from ledgerq.queue.runtime import Worker
from ledgerq.queue.scheduler import FirePass, fire_due
from ledgerq.queue.schedules import (
    add_schedule,
    get_schedule,
    list_schedules,
    pause_schedule,
    resume_schedule,
    retire_schedule,
)
from ledgerq.queue.submit import cancel_task, record_scheduled_fire, submit_many, submit_task
from ledgerq.queue.worker import (
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
    "RetryPolicy",
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
    "get_schedule",
    "host_scoped_concurrency_key",
    "list_schedules",
    "make_default_execute",
    "pause_schedule",
    "promote_due",
    "reap_expired_leases",
    "record_scheduled_fire",
    "register_heartbeat",
    "resume_schedule",
    "retire_schedule",
    "retry_run",
    "retry_runs",
    "submit_many",
    "submit_task",
    "worker_can_serve",
    "worker_tick",
]
