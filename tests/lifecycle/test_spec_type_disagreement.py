"""Processes whose specs disagree with the database on a column's type never open it:
the database records one type, and a process checking values against another would
store what its own spec never allowed (SQLite's affinity turned a text '12' into the
integer 12, and ``verify`` reported drift ``rebuild`` could not fix)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from evolution_support import SpecDir
from ledgerq import StateDB
from ledgerq.errors import MigrationRefused
from ledgerq.lifecycle import load_registry
from ledgerq.projections import verify


def specs_with(tmp: Path, kind: str) -> Path:
    """The packaged specs, with schedule_run given a column ``score`` of type ``kind``."""
    return SpecDir(tmp / f"specs-{kind}").replace(
        "[columns]\n", f'[columns]\nscore = "{kind}"\n').path


async def test_a_process_whose_spec_retypes_a_column_is_refused(db_target: str,
                                                               tmp_path: Path) -> None:
    async with StateDB(db_target, registry=load_registry(specs_with(tmp_path, "integer"))):
        pass
    with pytest.raises(MigrationRefused) as caught:
        async with StateDB(db_target, registry=load_registry(specs_with(tmp_path, "text"))):
            pass
    message = str(caught.value)
    assert "column 'score' is integer in the database's spec and text in these specs" \
        in message and "nothing was changed" in message
    async with StateDB(db_target) as db:  # a process without the column opens as before
        assert (await verify(db)).ok


OPEN = textwrap.dedent("""
    import asyncio, sys, time
    from pathlib import Path
    from ledgerq import StateDB
    from ledgerq.errors import MigrationRefused
    from ledgerq.lifecycle import load_registry
    target, specs, go = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    registry = load_registry(specs)
    while not go.exists():
        time.sleep(0.001)
    async def main():
        try:
            async with StateDB(target, registry=registry):
                print("opened")
        except MigrationRefused as exc:
            print("refused", str(exc).replace(chr(10), " "))
    asyncio.run(main())
""")


def test_concurrent_openers_adding_a_column_as_two_types_one_wins(db_target: str,
                                                                  tmp_path: Path) -> None:
    """Three processes open a fresh database at once, two adding ``score`` as integer
    and one as text: the first migration decides; every opener of the other type is
    refused, every opener of the same type opens."""
    kinds = ["integer", "text", "integer"]
    # The database exists (made by the packaged specs): the openers race to migrate it.
    # (Three openers of a file that does not exist yet also race to create it, which
    # SQLite may refuse one of at once as "locked": not what this test is about.)
    async def made() -> None:
        async with StateDB(db_target):
            pass

    asyncio.run(made())
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", OPEN, db_target,
                               str(specs_with(tmp_path / str(i), kind)), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, kind in enumerate(kinds)]
    time.sleep(1.0)  # each has loaded its specs and waits
    go.touch()
    said = [p.communicate(timeout=120) for p in procs]
    lines = [out.strip() for out, _ in said]
    assert all(line.startswith(("opened", "refused")) for line in lines), said
    won = {kind for kind, line in zip(kinds, lines, strict=True) if line == "opened"}
    assert len(won) == 1, lines
    (winner,) = won
    for kind, line in zip(kinds, lines, strict=True):
        assert (kind == winner) == (line == "opened"), lines
        if kind != winner:
            assert "column 'score'" in line and winner in line and kind in line
