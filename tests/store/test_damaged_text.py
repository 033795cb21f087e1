"""Text in a SQLite file that is not UTF-8 (a damaged page, a foreign writer's bytes)
is reported as a damaged database, never as a UnicodeDecodeError traceback: ledgerq
itself only ever writes UTF-8."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ledgerq import StateDB
from ledgerq.errors import DatabaseDamaged
from ledgerq.queue import TaskApplication, get_run, submit_task


def flip(path: Path, marker: bytes, *, every: bool = False) -> None:
    """Make the first byte of ``marker``'s first (or every) occurrence in the file 0xFF."""
    data = bytearray(path.read_bytes())
    at = data.find(marker)
    assert at >= 0, marker
    while at >= 0:
        data[at] = 0xFF
        at = data.find(marker, at + 1) if every else -1
    path.write_bytes(bytes(data))


async def make(path: Path, marker: str = "") -> str:
    async with StateDB(str(path)) as db:
        return await submit_task(db, TaskApplication("command", {"argv": ["true", marker]},
                                                     "host"))


async def test_schema_text_that_is_not_utf8_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "schema.db"
    await make(path)
    flip(path, b"schedule_definitions")  # in the schema's own text: every statement quotes it
    with pytest.raises(DatabaseDamaged, match="not UTF-8"):
        async with StateDB(str(path)):
            pass
    for args in (["stats"], ["submit", "command", "--", "true"]):
        res = subprocess.run([sys.executable, "-m", "ledgerq", "--db", str(path), *args],
                             capture_output=True, text=True, timeout=60, check=False)
        assert res.returncode == 1, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ledgerq: error: database is damaged")


async def test_a_row_whose_text_is_not_utf8_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "row.db"
    run_id = await make(path, "zz-marker-zz")
    flip(path, b"zz-marker-zz", every=True)  # the row's args and its fact's copy
    async with StateDB(str(path)) as db:
        with pytest.raises(DatabaseDamaged, match="UTF-8"):
            await get_run(db, run_id)
