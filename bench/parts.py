"""CPU per row of each part of a lifecycle, the schema floor's statements against
ledgerq's units alone: which part of the engine costs what above the floor.

Both commit 64 rows per transaction at ``synchronous=OFF`` (no fsync: CPU only), as the
64-submitter case groups them: submits (joined in one unit, as ledgerq joins the submits
of one turn), then claim passes of 64, then the terminal writes. ``--without`` also runs
the units with one of the engine's steps removed (a measurement only, never a
configuration): ``checks`` (the per-value type check of every creation and move) or
``dependents`` (the lookup of a run's dependents at its end), to show how much of the
gap each step is.

Run: .venv/bin/python bench/parts.py [--rounds 5] [--without checks --without dependents]
"""

from __future__ import annotations

import os.path
import sys

# ruff: noqa: E402  (the imports below must follow the sys.path fix)
# bench/queue.py would shadow the standard library's queue (which aiosqlite imports).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from ledgerq.codec import dumps
from ledgerq.lifecycle import claims, creation, default_registry, moves, values
from ledgerq.queue.submission.application import digest
from ledgerq.store.sqlite.schema import schema_ddl
from ledgerq.store.sqltx import SqlTx

sys.path.append(_HERE)  # last, so the stdlib's queue still wins
from floor import APP, claim_page, claim_rows, connect, end_row, submit_rows
from units import Units

GROUP = 64
PARTS = ("submit", "claim", "finish")


def _timed(fn: Callable[[], Any], rows: int) -> float:
    start = time.process_time()
    fn()
    return (time.process_time() - start) / rows * 1e6


def floor_parts(path: str, n: int) -> dict[str, float]:
    registry = default_registry()
    conn = connect(path, "OFF")
    conn.executescript(schema_ddl(registry))
    page = claim_page(registry)
    x = conn.execute
    args, fingerprint = dumps(APP.args), digest(APP)
    claimed: list[dict[str, Any]] = []

    def in_groups(step: Callable[[int], None]) -> Callable[[], None]:
        def run() -> None:
            for first in range(0, n, GROUP):
                x("BEGIN IMMEDIATE")
                step(first)
                x("COMMIT")
        return run

    out = {
        "submit": _timed(in_groups(lambda _: submit_rows(conn, args, fingerprint, GROUP)), n),
        "claim": _timed(in_groups(lambda _: claimed.extend(claim_rows(x, page, GROUP))), n),
        "finish": _timed(in_groups(lambda first: [end_row(x, r)
                                                  for r in claimed[first:first + GROUP]]), n),
    }
    conn.close()
    return out


def units_parts(path: str, n: int) -> dict[str, float]:
    units = Units(path, default_registry(), "OFF")
    ids: list[str] = []
    claimed: list[dict[str, Any]] = []

    def submits() -> None:
        for _ in range(0, n, GROUP):
            ids.extend(units.group([partial(units.submit_joined, count=GROUP,
                                            now=time.time())])[0])

    def claims() -> None:
        for first in range(0, n, GROUP):
            claimed.extend(units.group([partial(units.claim_pass, rids=ids[first:first + GROUP],
                                                now=time.time())])[0])

    def finishes() -> None:
        for first in range(0, n, GROUP):
            now = time.time()
            units.group([partial(units.finish, runs=claimed[first:first + GROUP], now=now)])

    out = {"submit": _timed(submits, n), "claim": _timed(claims, n),
           "finish": _timed(finishes, n)}
    units.close()
    return out


@contextlib.contextmanager
def without(step: str) -> Iterator[None]:
    """The units with one engine step stubbed out, for this measurement only."""
    if step == "checks":
        # Each module that checks values holds its own reference to check_values. (No
        # columns to encode: the units' rows carry their JSON columns as text.)
        checking = (moves, claims, creation)
        for module in checking:
            module.check_values = lambda *a, **k: []  # type: ignore[assignment]
        try:
            yield
        finally:
            for module in checking:
                module.check_values = values.check_values
    else:
        SqlTx.list_dependents = lambda self, policy, run_ids: []  # type: ignore[method-assign]
        try:
            yield
        finally:
            del SqlTx.list_dependents  # (back to SharedOps' own)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--n", type=int, default=GROUP * 60, help="rows per round")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median)")
    ap.add_argument("--without", choices=["checks", "dependents"], action="append",
                    default=[], help="also run the units without this step (repeatable)")
    args = ap.parse_args()
    n = args.n - args.n % GROUP or GROUP
    systems: dict[str, Callable[[str, int], dict[str, float]]] = {
        "schema floor": floor_parts, "units alone": units_parts}
    for step in args.without:
        def stubbed(path: str, rows: int, step: str = step) -> dict[str, float]:
            with without(step):
                return units_parts(path, rows)
        systems[f"units without {step}"] = stubbed
    got: dict[str, list[dict[str, float]]] = {name: [] for name in systems}
    with tempfile.TemporaryDirectory(prefix="ledgerq-bench-") as tmp:
        for r in range(args.rounds):
            for name, fn in systems.items():
                got[name].append(fn(os.path.join(tmp, f"{r}-{len(got[name])}-{name}.db"), n))
    print(f"CPU us per row, {n} rows per round in groups of {GROUP}, synchronous=OFF, median "
          f"of {args.rounds} interleaved rounds")
    print(f"{'system':26}" + "".join(f"{p:>9}" for p in PARTS) + f"{'total':>9}{'x floor':>9}")
    floor_total = sum(statistics.median(r[p] for r in got["schema floor"]) for p in PARTS)
    for name, rounds in got.items():
        med = [statistics.median(r[p] for r in rounds) for p in PARTS]
        print(f"{name:26}" + "".join(f"{v:9.1f}" for v in med)
              + f"{sum(med):9.1f}{sum(med) / floor_total:8.2f}x")


if __name__ == "__main__":
    main()
