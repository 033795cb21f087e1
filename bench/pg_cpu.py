"""CPU a drained lifecycle costs on PostgreSQL, the client's and the server's, per system.

bench/postgres.py gives rates; on a 2-core machine a drain with several workers is bound
by the CPU that client and server take together, so the rate alone does not say where a
system's time goes. This drains N pre-filled tasks with W worker processes of each system
in turn (bench/pg_peers/harness.py's drain, on a scratch database each) and reports, per
lifecycle:

  client  user + system CPU of the worker processes from their release to the poll
          that counted N done (/proc; their start-up and imports left out)
  server  user + system CPU of every postgres process (/proc: backends, the WAL writer,
          and the exited ones' through the postmaster's cumulative times), from before
          the workers connect to after they are done. The completion count is polled
          every 50 ms here, not every 5 ms as bench/postgres.py does: a count scans the
          table, which costs more on a wide one (ledgerq's: 2.3 ms a poll at N=10,000,
          78 us a lifecycle at 5 ms, against PgQueuer's 0.6 ms), and would be billed to
          the system. The rate is then 25 ms coarser; it is not this script's point.

Interleave runs (--rounds) and compare within a run; this VM's figures drift by 20%.

    .venv/bin/python bench/pg_cpu.py --n 10000 --workers 1
    .venv/bin/python bench/pg_cpu.py --only ledgerq-units pgqueuer --rounds 3
"""

# ruff: noqa: E402  (the imports below must follow the sys.path fix)
from __future__ import annotations

import os
import sys

# As in bench/postgres.py: bench/queue.py must not shadow the standard library's queue.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse

sys.path.append(_HERE)
from pg_peers import harness  # importable only after the line above
from postgres import DEFAULT_DSN, _ledgerq_peer, _peer_for

SYSTEMS = ["floor+log/batch", "schema-floor", "ledgerq-units", "pgqueuer", "ledgerq"]
#: Seconds between completion counts (see the docstring).
POLL = 0.05


def server_cpu() -> float:
    """Seconds of CPU every postgres process on this machine has used (exited children's
    included, through their parent's cumulative times)."""
    ticks = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if not stat[stat.index("(") + 1:stat.rindex(")")].startswith("postgres"):
            continue
        fields = stat.rsplit(")", 1)[1].split()
        ticks += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def drain(system: str, scratch: harness.Scratch, n: int, workers: int) -> str:
    peer = _ledgerq_peer() if system == "ledgerq" else _peer_for(system)
    name, dsn = scratch.create()
    try:
        peer.install(dsn)
        harness.fill(peer, dsn, n)
        used: list[float] = []
        s0 = server_cpu()
        seconds = harness.run_workers(peer, dsn, workers, n, cpu=used, poll=POLL)
        client, server = used[0], server_cpu() - s0
    finally:
        scratch.drop(name)
    return (f"{system:<16} {n / seconds:8.0f} /s   client {client * 1e6 / n:5.0f} us   "
            f"server {server * 1e6 / n:5.0f} us   both {(client + server) * 1e6 / n:5.0f} us"
            " a lifecycle")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--n", type=int, default=10000, help="tasks per drain (default 10000)")
    ap.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds (default 1)")
    ap.add_argument("--only", nargs="+", choices=SYSTEMS, help="systems to run")
    ap.add_argument("--dsn", default=DEFAULT_DSN,
                    help="admin DSN, used only to CREATE/DROP the scratch databases")
    args = ap.parse_args()
    scratch = harness.Scratch(args.dsn)
    print(f"drain of N={args.n} with W={args.workers}; CPU a lifecycle")
    try:
        for _ in range(args.rounds):
            for system in args.only or SYSTEMS:
                print(drain(system, scratch, args.n, args.workers), flush=True)
    finally:
        scratch.drop_all()


if __name__ == "__main__":
    main()
