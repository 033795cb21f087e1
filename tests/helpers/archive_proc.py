"""Runs ``archive_runs`` and holds still at one named moment, so that a test can SIGKILL
the process exactly there (tests/queue/maintenance/test_archive_crash.py).

    python archive_proc.py TARGET FILE BEFORE MOMENT

MOMENT: ``copying`` (rows half copied into FILE.partial), ``written`` (FILE.partial
complete and fsynced, nothing deleted yet), ``published`` (renamed to FILE, rows deleted
inside the transaction, not committed), ``committed`` (archive_runs returned). The
process prints the moment's name when it gets there, then sleeps.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ledgerq import StateDB
from ledgerq.queue.maintenance.archive import archive_runs
from ledgerq.store.sqlite import archive_file


def hold(moment: str) -> None:
    print(moment, flush=True)
    time.sleep(3600)


def main() -> None:
    target, to, before, moment = sys.argv[1:5]
    write, publish = archive_file.write, archive_file.publish

    def held_write(path: Path, manifest: Any, table: str, columns: Any,
                   rows: Iterator[dict[str, Any]], facts: Iterator[dict[str, Any]]) -> Any:
        def slow(rows: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
            for i, r in enumerate(rows):
                if moment == "copying" and i == 3:
                    hold(moment)
                yield r

        archive_file.BATCH = 2  # rows reach the partial file before the hold
        done = write(path, manifest, table, columns, slow(rows), facts)
        if moment == "written":
            hold(moment)
        return done

    def held_publish(path: Path) -> None:
        publish(path)
        if moment == "published":
            hold(moment)

    archive_file.write = held_write  # type: ignore[assignment]
    archive_file.publish = held_publish  # type: ignore[assignment]

    async def go() -> None:
        async with StateDB(target) as db:
            await archive_runs(db, before=float(before), to=to)
            if moment == "committed":
                hold(moment)

    asyncio.run(go())


if __name__ == "__main__":
    main()
