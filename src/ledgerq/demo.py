"""``ledgerq demo``: the queue end to end on a fresh SQLite file, with a worker crash.

What it does, in order:

1. submits a mixed batch of real ``command`` tasks (they run ``python -c ...``, so
   nothing but the interpreter is needed): successes, a failure, a dependency that
   completes and one that fails, a running task that gets cancelled, a flaky task
   that succeeds on its retry, and one that hits its timeout;
2. starts worker A (``python -m ledgerq worker``, capacity 1, 2 s leases) which claims
   the oldest task, a 4-second ``long`` one, then worker B (capacity 4) for the rest;
3. SIGKILLs worker A (and its child, as a host crash would) while ``long`` runs; the
   lease stops being renewed, B's reaper requeues it (``run.queued.lease_expired``)
   and B runs it to completion;
4. stops B with SIGTERM (graceful), prints ``long``'s history, the per-status counts
   and ``verify()``, and exits 0 only if every task ended as expected.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ledgerq.lifecycle.models import Actor
from ledgerq.projections.log import verify
from ledgerq.queue import moves
from ledgerq.queue.reads import get_runs, queue_stats, run_history
from ledgerq.queue.submission.application import RetryPolicy, TaskApplication
from ledgerq.queue.submission.submit import cancel_task, submit_task
from ledgerq.store.db import StateDB

LEASE_TTL = 2.0
POLL_INTERVAL = 0.1
#: The whole demo gives up (exit 1) after this many seconds.
DEADLINE = 50.0
#: How long ``long`` runs on worker A before A is killed (past at least one renewal).
KILL_AFTER = 1.5
OPERATOR = Actor(type="operator", id="demo-operator")


@dataclass
class DemoTask:
    label: str
    code: str
    expect: str
    note: str
    retry: RetryPolicy | None = None
    timeout: float | None = None
    after: str | None = None
    run_id: str = ""
    seen: list[str] = field(default_factory=list)


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def build_tasks(workdir: Path) -> list[DemoTask]:
    marker = str(workdir / "flaky.marker")
    flaky = (
        "import os, sys\n"
        f"m = {marker!r}\n"
        "if os.path.exists(m):\n    print('second try works'); sys.exit(0)\n"
        "open(m, 'w').close(); sys.stderr.write('first try fails\\n'); sys.exit(1)\n"
    )
    return [
        DemoTask("long", "import time; time.sleep(4); print('long done')", "completed",
                 "4 s; its worker is killed mid-run"),
        DemoTask("cancel-me", "import time; time.sleep(30)", "cancelled",
                 "cancelled by an operator while running"),
        DemoTask("hello", "print('hello')", "completed", "succeeds"),
        DemoTask("checksum", "import hashlib; print(hashlib.sha256(b'ledgerq').hexdigest())",
                 "completed", "succeeds"),
        DemoTask("disk-full", "import sys; sys.stderr.write('disk full\\n'); sys.exit(3)",
                 "failed", "exits 3"),
        DemoTask("build", "import time; time.sleep(1); print('built')", "completed",
                 "1 s"),
        DemoTask("deploy", "print('deployed')", "completed", "depends on build",
                 after="build"),
        DemoTask("report", "print('never runs')", "cancelled", "depends on disk-full",
                 after="disk-full"),
        DemoTask("flaky", flaky, "completed", "fails once, retried after 0.5 s",
                 retry=RetryPolicy(max_attempts=3, base_delay=0.5)),
        DemoTask("slowpoke", "import time; time.sleep(30)", "timed_out", "1 s timeout",
                 timeout=1.0),
    ]


def start_worker(db: Path, worker_id: str, capacity: int, workdir: Path
                 ) -> tuple[subprocess.Popen[bytes], Path]:
    log = workdir / f"{worker_id}.log"
    argv = [sys.executable, "-m", "ledgerq", "worker", "--db", str(db),
            "--worker-id", worker_id, "--capacity", str(capacity),
            "--lease-ttl", str(LEASE_TTL), "--poll-interval", str(POLL_INTERVAL),
            "--lock-dir", str(workdir / "locks"), "--shutdown-grace", "5"]
    with log.open("wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    return proc, log


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc; elsewhere none are found)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as fh:
                found += [int(p) for p in fh.read().split()]
    return found


def crash(proc: subprocess.Popen[bytes]) -> list[int]:
    """SIGKILL a worker and its children's process groups, as a host crash would."""
    children = child_pids(proc.pid)
    proc.kill()
    proc.wait()
    for child in children:
        with contextlib.suppress(OSError):
            os.killpg(child, signal.SIGKILL)
    return children


def stop(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return None
    return proc.returncode


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


async def run_demo(db_path: Path | None, console: Console) -> int:
    """Run the demo; returns the exit code (0 when everything ended as expected)."""
    if db_path is None:  # everything in one new temporary directory
        workdir = Path(tempfile.mkdtemp(prefix="ledgerq-demo-"))
        path = workdir / "demo.db"
    else:  # worker logs, locks and markers next to the given database
        path = db_path
        workdir = path.parent / f"{path.name}.demo"
        workdir.mkdir(parents=True, exist_ok=True)
    console.rule("[bold]ledgerq demo")
    console.print(f"database: [bold]{path}[/bold]   (work dir {workdir})")
    tasks = build_tasks(workdir)
    by_label = {t.label: t for t in tasks}
    procs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    try:
        async with StateDB(path) as db:
            return await _drive(db, path, workdir, tasks, by_label, procs, console)
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


async def _drive(db: StateDB, path: Path, workdir: Path, tasks: list[DemoTask],
                 by_label: dict[str, DemoTask], procs: dict[str, tuple[subprocess.Popen[bytes],
                                                                        Path]],
                 console: Console) -> int:
    t0 = time.time()
    for t in tasks:
        deps = (by_label[t.after].run_id,) if t.after else ()
        t.run_id = await submit_task(db, TaskApplication(
            action_kind="command", args={"argv": python(t.code)}, execution_target="host",
            retry=t.retry, timeout_seconds=t.timeout, depends_on=deps))
    console.print(f"submitted {len(tasks)} command tasks "
                  f"(lease TTL {LEASE_TTL:g}s, renewed every {LEASE_TTL / 3:.2f}s)")
    terminal = db.registry.entity(moves.ENTITY).terminal
    long = by_label["long"]
    victim: str | None = None
    claimed_at = 0.0
    killed = cancelled = False
    recovered_by: str | None = None
    ok = True

    procs["worker-a"] = start_worker(path, "worker-a", 1, workdir)
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
               TextColumn("{task.completed}/{task.total} ended"), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task("running", total=len(tasks))

        def say(text: str) -> None:
            progress.console.print(f"[dim]{time.time() - t0:5.2f}s[/dim]  {text}")

        say("started worker-a (capacity 1): it claims the oldest task, [bold]long[/bold]")
        while True:
            rows = await get_runs(db, [t.run_id for t in tasks])
            for t in tasks:
                row = rows[t.run_id]
                state = f"{row['status']}@{row['leased_by'] or ''}"
                if not t.seen or t.seen[-1] != state:
                    if t.seen:
                        who = f" by {row['leased_by']}" if row["leased_by"] else ""
                        say(f"{t.label:<10} -> {row['status']}{who}")
                    t.seen.append(state)
            done = sum(1 for t in tasks if rows[t.run_id]["status"] in terminal)
            progress.update(bar, completed=done)
            lrow = rows[long.run_id]
            now = time.time()

            if victim is None and lrow["status"] == "running":
                victim, claimed_at = lrow["leased_by"], now
                procs["worker-b"] = start_worker(path, "worker-b", 4, workdir)
                say("started worker-b (capacity 4) for everything else")
            if (victim and not killed and lrow["status"] == "running"
                    and lrow["leased_by"] == victim and now - claimed_at >= KILL_AFTER):
                children = crash(procs[victim][0])
                killed = True
                say(f"[bold red]SIGKILL {victim}[/bold red] (pid {procs[victim][0].pid}"
                    f"{', and its child group ' + str(children) if children else ''}) "
                    "while it runs long: its lease is no longer renewed")
            if killed and recovered_by is None and lrow["status"] == "running" \
                    and lrow["leased_by"] not in (None, victim):
                recovered_by = lrow["leased_by"]
            cme = by_label["cancel-me"]
            if not cancelled and (rows[cme.run_id]["status"] == "running" or now - t0 > 8):
                await cancel_task(db, cme.run_id, actor=OPERATOR,
                                  summary="demo: no longer needed")
                cancelled = True
                say("operator cancels cancel-me (its worker kills the child)")
            if done == len(tasks):
                break
            if now - t0 > DEADLINE:
                say(f"[red]gave up after {DEADLINE:g}s[/red]")
                ok = False
                break
            await asyncio.sleep(0.1)
        progress.update(bar, description="all ended" if ok else "incomplete")

    survivor_rc: int | None = None
    if "worker-b" in procs:
        survivor_rc = stop(procs["worker-b"][0])
        console.print(f"stopped worker-b with SIGTERM: exit code {survivor_rc}")
    return await _report(db, path, tasks, long, victim, recovered_by, survivor_rc, ok, procs,
                         t0, console)


async def _report(db: StateDB, path: Path, tasks: list[DemoTask], long: DemoTask,
                  victim: str | None, recovered_by: str | None, survivor_rc: int | None,
                  ok: bool, procs: dict[str, tuple[subprocess.Popen[bytes], Path]],
                  t0: float, console: Console) -> int:
    rows = await get_runs(db, [t.run_id for t in tasks])
    summary = Table(title="tasks", title_justify="left", header_style="bold")
    for name in ("TASK", "WHAT", "STATUS", "EXPECTED", "RUNS", "EXIT", "REASON", "ID"):
        summary.add_column(name, no_wrap=name == "ID")
    for t in tasks:
        row = rows[t.run_id]
        good = row["status"] == t.expect
        ok &= good
        summary.add_row(t.label, t.note,
                        Text(row["status"], style="green" if good else "bold red"),
                        t.expect, str(row["run_attempts"]),
                        "" if row["exit_code"] is None else str(row["exit_code"]),
                        row["status_reason_code"] or "", t.run_id)
    console.print(summary)

    facts = await run_history(db, long.run_id)
    hist = Table(title=f"history of long ({long.run_id})", title_justify="left",
                 header_style="bold")
    for name in ("V", "AT", "FROM", "TO", "REASON", "ACTOR", "SUMMARY"):
        hist.add_column(name)
    for f in facts:
        style = "bold yellow" if f["reason_code"] == "run.queued.lease_expired" else ""
        hist.add_row(str(f["entity_version"]), f"+{f['created_at'] - t0:.2f}s",
                     f["previous_status"] or "(created)", f["status"],
                     Text(f["reason_code"], style=style), f"{f['source']}:{f['actor']}",
                     f["reason_summary"] or "", style=style)
    console.print(hist)
    codes = [f["reason_code"] for f in facts]
    lease_recovered = ("run.queued.lease_expired" in codes and codes[-1] == "run.completed.ok"
                       and recovered_by is not None and recovered_by != victim)
    if lease_recovered:
        console.print(f"lease recovery: {victim} was killed, the reaper requeued long "
                      f"(run.queued.lease_expired) and {recovered_by} finished it")
    else:
        console.print("[red]lease recovery was not observed[/red]")

    stats = await queue_stats(db)
    counts = Table(title="runs per status", title_justify="left", header_style="bold")
    counts.add_column("STATUS")
    counts.add_column("RUNS", justify="right")
    for status, n in stats.counts.items():
        counts.add_row(status, str(n))
    counts.add_row("total", str(stats.total))
    console.print(counts)

    report = await verify(db)
    if report.ok:
        console.print(f"verify(): [green]clean[/green] — {report.rows} rows agree with "
                      f"{report.facts} facts")
    else:
        console.print(f"verify(): [red]{len(report.drift)} drift finding(s)[/red]")
        for d in report.drift[:10]:
            console.print(f"  {d}")
    success = ok and lease_recovered and report.ok and survivor_rc == 0
    if not success:
        for name, (_, log) in procs.items():
            console.print(f"[dim]--- last lines of {name}'s log ({log})[/dim]")
            console.print(Text(tail(log)))
    console.rule("[bold green]demo ok" if success else "[bold red]demo failed")
    console.print(f"explore: ledgerq show {long.run_id} --db {path}\n"
                  f"         ledgerq ls --db {path}   ledgerq stats --db {path}")
    return 0 if success else 1


__all__ = ["build_tasks", "run_demo"]
