"""docs/testing.md is executable: its files make a project whose pytest run passes, on
SQLite and with the fixtures on PostgreSQL (``--ledgerq-postgres``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from test_docs import block

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "testing.md"
FILES = [("test_orders.py", "python"), ("test_order_rules.py", "python"),
         ("test_order_strategies.py", "python"), ("pytest.ini", "ini"),
         ("tasks.py", "python"), ("test_fixtures.py", "python")]


def project(at: Path) -> Path:
    """The page's files, and the order's spec from docs/lifecycles.md."""
    (at / "specs").mkdir()
    (at / "specs" / "shop_order.toml").write_text(
        block(ROOT / "docs" / "lifecycles.md", "example: shop_order.toml", "toml"),
        encoding="utf-8")
    for name, lang in FILES:
        (at / name).write_text(block(DOC, f"example: {name}", lang), encoding="utf-8")
    return at


def pytest_run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LEDGERQ_TEST_POSTGRES", "LEDGERQ_APP", "PYTEST_ADDOPTS")}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, check=False, env=env)


def test_the_pages_project_passes(tmp_path: Path) -> None:
    res = pytest_run(project(tmp_path))
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "5 passed" in res.stdout, res.stdout[-2000:]


def test_the_fixtures_on_postgres(tmp_path: Path, pg_database: str) -> None:
    """``--ledgerq-postgres``: each test gets a schema of that database, dropped after."""
    res = pytest_run(project(tmp_path), "test_fixtures.py", "--ledgerq-postgres",
                     pg_database)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "2 passed" in res.stdout, res.stdout[-2000:]
    import psycopg

    with psycopg.connect(pg_database) as conn:
        left = conn.execute("SELECT nspname FROM pg_namespace "
                            "WHERE nspname LIKE 'ledgerq_test%'").fetchall()
    assert left == []
