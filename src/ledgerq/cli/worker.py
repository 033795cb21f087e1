"""``ledgerq worker``: the long-running process that claims and executes runs."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from ledgerq.cli.app import app
from ledgerq.cli.db import DbOption, db_path, open_db, root_specs, run
from ledgerq.cli.failures import DOMAIN_FAILURE, check_choice, die, text_option
from ledgerq.cli.render import printable
from ledgerq.queue import DEFAULT_HEARTBEAT_TTL_SECONDS
from ledgerq.queue.worker import service as runtime
from ledgerq.queue.worker.launcher import MAX_OUTPUT_TAIL_BYTES, OUTPUT_TAIL_BYTES

#: PostgreSQL connections a ``ledgerq worker`` pools (its LISTEN one besides, and its lease
#: keeper shares them): one measured as fast as eight for a drain (docs/scaling.md), and
#: forty workers then fit in a server's default 100 connections.
WORKER_POOL_SIZE = 1

#: ``ledgerq worker`` runs a worker; ``ledgerq worker stop ID`` (cli/workers.py) asks one
#: to drain. A group whose callback is the worker itself, so both spellings work.
worker_app = typer.Typer(no_args_is_help=False, add_completion=False)
app.add_typer(worker_app, name="worker")


@worker_app.callback(invoke_without_command=True)
def worker(
    ctx: typer.Context,
    capacity: Annotated[int, typer.Option("--capacity", "-c", min=1,
                                          help="Runs executed at once.")
    ] = runtime.DEFAULT_CAPACITY,
    cap: Annotated[list[str] | None, typer.Option(
        "--cap", help="An advertised capability token. Repeatable.",
        show_default=False)] = None,
    target: Annotated[list[str] | None, typer.Option(
        "--target", "-t", help="An execution target served. Repeatable (default: host).",
        show_default=False)] = None,
    queue: Annotated[list[str] | None, typer.Option(
        "--queue", help="A named queue served: only its runs are claimed. Repeatable "
        "(default: default).", show_default=False)] = None,
    poll_interval: Annotated[float, typer.Option(
        "--poll-interval", min=0.001, help="Seconds between claim passes when idle.")
    ] = runtime.DEFAULT_POLL_INTERVAL,
    lease_ttl: Annotated[float, typer.Option(
        "--lease-ttl", min=0.1, help="Lease length in seconds; renewed every third.")
    ] = runtime.DEFAULT_WORKER_LEASE_TTL,
    heartbeat_ttl: Annotated[float, typer.Option(
        "--heartbeat-ttl", min=0.1, help="A worker silent this long claims nothing.")
    ] = DEFAULT_HEARTBEAT_TTL_SECONDS,
    shutdown_grace: Annotated[float, typer.Option(
        "--shutdown-grace", min=0.0,
        help="On SIGINT/SIGTERM, seconds running runs get before being requeued.")
    ] = runtime.DEFAULT_SHUTDOWN_GRACE,
    worker_id: Annotated[str | None, typer.Option(
        "--worker-id", help="Worker id (default: host:<8 hex>).", show_default=False)] = None,
    lock_dir: Annotated[Path | None, typer.Option(
        "--lock-dir", help="Directory of the per-concurrency-key OS lock files "
                           "(default: <tmp>/ledgerq-locks).",
        show_default=False, file_okay=False)] = None,
    output_tail: Annotated[int, typer.Option(
        "--output-tail", min=0, max=MAX_OUTPUT_TAIL_BYTES, metavar="BYTES",
        help="Bytes of each of stdout and stderr a run records when it ends (0: none).")
    ] = OUTPUT_TAIL_BYTES,
    max_tasks: Annotated[int | None, typer.Option(
        "--max-tasks", min=1, metavar="N", help="Recycle: after claiming N runs, stop "
        "claiming and exit once they have finished.", show_default=False)] = None,
    max_runtime: Annotated[str | None, typer.Option(
        "--max-runtime", metavar="DURATION", help="Recycle: after this long (e.g. 1h), "
        "stop claiming and exit once idle.", show_default=False)] = None,
    pool_size: Annotated[int, typer.Option(
        "--pool-size", min=1, metavar="N",
        help="PostgreSQL: pooled connections of this worker (its LISTEN one besides), "
             "whatever its capacity; its writes are short and take turns on them.")
    ] = WORKER_POOL_SIZE,
    quiet: Annotated[bool, typer.Option("--quiet", "-q",
                                        help="No per-run lines on stderr.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v",
                                          help="Log the worker's INFO messages.")] = False,
    no_scheduler: Annotated[bool, typer.Option(
        "--no-scheduler", help="Do not fire schedules from this worker (by default every "
                               "worker runs a scheduler pass; each slot still fires once).")
    ] = False,
    metrics_port: Annotated[int | None, typer.Option(
        "--metrics-port", min=0, max=65535, show_default=False,
        help="Serve Prometheus /metrics on 127.0.0.1:PORT (as ledgerq serve has them).")
    ] = None,
    app_name: Annotated[str | None, typer.Option(
        "--app", envvar="LEDGERQ_APP", metavar="MODULE:APP", show_default=False,
        help="Serve this ledgerq App's tasks (e.g. myproject.tasks:app; env LEDGERQ_APP). "
             "Its database is the default --db; its tasks' queues the default --queue.")
    ] = None,
    db: DbOption = None,
) -> None:
    """Run a worker until SIGINT/SIGTERM: claim, execute, renew leases, reap, retry.

    On a signal it stops claiming, lets running runs finish within --shutdown-grace,
    then stops their process groups and requeues them. --max-tasks, --max-runtime and
    `ledgerq worker stop ID` drain it instead: no more claims, exit once idle.
    """
    if ctx.invoked_subcommand is not None:
        return
    from ledgerq.durations import parse_duration
    from ledgerq.errors import InvalidInput
    from ledgerq.queue.submission.application import EXECUTION_TARGETS

    runtime_limit = None
    if max_runtime is not None:
        try:
            runtime_limit = parse_duration(max_runtime, "--max-runtime")
        except InvalidInput as exc:
            die(str(exc))
        if runtime_limit <= 0:
            die(f"--max-runtime: {max_runtime!r} must be more than zero")

    targets = list(target or ["host"])
    check_choice("execution target", targets, sorted(EXECUTION_TARGETS))
    from ledgerq.queue.worker.config import served_queues

    try:
        served_queues(queue)
    except InvalidInput as exc:
        die(f"--queue: {exc}")
    # Both are stored (the workers table, every fact the worker writes): UTF-8 text only.
    if worker_id is not None:
        text_option(worker_id, "--worker-id")
    for i, token in enumerate(cap or []):
        text_option(token, f"--cap[{i}]")
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    task_app = None
    if app_name is not None:
        from ledgerq.tasks.loading import load_app

        try:
            task_app = load_app(app_name)
        except InvalidInput as exc:
            die(str(exc))
        root = ctx.find_root().obj
        explicit = db is not None or (isinstance(root, dict) and root.get("db") is not None) \
            or os.environ.get("LEDGERQ_DB")
        if not explicit:
            db = str(task_app.target)
        if not queue:
            queue = sorted(task_app.queues)
    path = db_path(ctx, db)

    async def go() -> None:
        from ledgerq.queue.worker.finished import Finished
        from ledgerq.queue.worker.launcher import default_execute
        from ledgerq.queue.worker.service import DEFAULT_LOCK_DIR, MetricsUnavailable, Worker

        # The app's specs, unless the command names its own (--specs).
        specs = task_app.registry if task_app is not None and root_specs(ctx) is None \
            else None
        async with open_db(ctx, path, must_exist=False, by_record=False,
                           registry=specs, pool_size=pool_size) as handle:
            if task_app is not None:
                # What its tasks are, for submissions by name and for the runs a state's
                # on_enter defers (their queue, retry policy, timeout).
                await task_app.record_tasks(handle)
            holder: dict[str, str] = {}

            def say(text: str) -> None:
                if not quiet:
                    stamp = datetime.now().strftime("%H:%M:%S.%f")[:-3]
                    sys.stderr.write(printable(f"{stamp} {holder.get('id', '')} {text}") + "\n")
                    sys.stderr.flush()

            # It wraps the launcher: it serves the kinds the launcher can run.
            @functools.wraps(default_execute)
            async def execute(row: dict[str, Any]) -> tuple[int, str] | Finished:
                start = time.monotonic()
                say(f"run {row['id']} start {row['action_kind']}")
                try:
                    got = await default_execute(row)
                except asyncio.CancelledError:
                    say(f"run {row['id']} stopped after {time.monotonic() - start:.2f}s")
                    raise
                say(f"run {row['id']} exit {got[0]} after {time.monotonic() - start:.2f}s")
                return got

            w = Worker(handle, worker_id=worker_id, capacity=capacity,
                       poll_interval=poll_interval, lease_ttl=lease_ttl,
                       heartbeat_ttl=heartbeat_ttl, advertised_capabilities=list(cap or []),
                       execution_targets=targets, execute=execute, handle_signals=True,
                       adapters=task_app.executors(capacity) if task_app else None,
                       lock_dir=lock_dir if lock_dir is not None else DEFAULT_LOCK_DIR,
                       shutdown_grace=shutdown_grace, scheduler=not no_scheduler,
                       output_tail=output_tail, max_tasks=max_tasks,
                       max_runtime=runtime_limit, queues=queue or None,
                       metrics_port=metrics_port)
            holder["id"] = w.worker_id
            # What the connection really runs with, read back: a durability setting that
            # did not take must not be announced as if it had.
            durability = await handle.durability()
            sys.stderr.write(printable(
                f"ledgerq worker {w.worker_id} (pid {os.getpid()}): capacity {capacity}, "
                f"targets {','.join(targets)}, capabilities {','.join(cap or []) or '-'}, "
                f"lease {lease_ttl:g}s, scheduler {'on' if w.scheduler else 'off'}, "
                f"{durability}, "
                f"db {path}") + "\n")
            sys.stderr.flush()
            try:
                await w.run()
            except MetricsUnavailable as exc:
                # A worker that says it exports metrics and does not would go unseen by
                # every dashboard that scrapes it: it refuses to start instead.
                die(f"--metrics-port {metrics_port}: {exc}")
            summary = ", ".join(f"{n} {k}" for k, n in sorted(w.outcomes.items())) or "no runs"
            if w.recycling.why is not None:
                summary += f"; drained: {w.recycling.why}"
            sys.stderr.write(printable(f"ledgerq worker {w.worker_id} stopped: {summary}")
                             + "\n")

    from ledgerq.errors import DatabaseError

    try:
        run(go())
    except ValueError as exc:
        die(str(exc))
    except DatabaseError as exc:  # the file was deleted, replaced or damaged under it
        die(str(exc), DOMAIN_FAILURE)
