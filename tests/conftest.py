"""Shared test fixtures: an open StateDB on a temporary file, and hypothesis profiles.

Hypothesis profiles (select with LEDGERQ_HYPOTHESIS_PROFILE, default "ci"):

* ``ci``   — 150 examples per property; stateful machines run up to 50 steps each.
* ``long`` — 2000 examples per property; stateful machines run up to 80 steps each.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from ledgerq import StateDB

settings.register_profile(
    "ci",
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "long",
    max_examples=2000,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("LEDGERQ_HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state.db"


@pytest.fixture
async def db(db_path: Path) -> AsyncIterator[StateDB]:
    """An open StateDB (packaged specs, WAL) on a fresh file."""
    async with StateDB(db_path) as handle:
        yield handle
