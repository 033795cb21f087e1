"""Optional extras: a feature whose extra is missing says which ``pip install`` adds it.

Each test runs a fresh interpreter in which the extra's modules cannot be imported
(``sys.modules[name] = None`` makes both ``import`` and ``find_spec`` see them absent),
as on a core install.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

BLOCK = "import sys\nfor m in {modules!r}: sys.modules[m] = None\n"


def run_without(modules: list[str], code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    script = BLOCK.format(modules=modules) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True,
                          text=True, timeout=60, check=False)


def test_postgres_url_without_the_postgres_extra_names_it(tmp_path: Path) -> None:
    res = run_without(["psycopg", "psycopg_pool"], """
        from ledgerq import StateDB
        from ledgerq.errors import MissingExtra
        try:
            StateDB("postgresql://u@127.0.0.1:5432/x")
        except MissingExtra as exc:
            assert isinstance(exc, ImportError)
            print(exc)
        else:
            raise SystemExit("no refusal")
    """, tmp_path)
    assert res.returncode == 0, res.stderr
    assert "pip install 'ledgerq[postgres]'" in res.stdout


def test_sqlite_and_the_cli_need_no_extra(tmp_path: Path) -> None:
    res = run_without(["psycopg", "psycopg_pool", "fastapi", "uvicorn", "starlette"], """
        import asyncio, sys
        from ledgerq import StateDB
        from ledgerq.projections import verify

        async def main():
            async with StateDB("core.db") as db:
                assert (await verify(db)).ok
        asyncio.run(main())
        sys.argv = ["ledgerq", "--db", "core.db", "stats", "--json"]
        from ledgerq.cli import main
        main()
    """, tmp_path)
    assert res.returncode == 0, res.stderr
    assert '"total"' in res.stdout or "{" in res.stdout


def test_cli_postgres_and_serve_without_extras_are_one_line(tmp_path: Path) -> None:
    for argv, extra in ((["--db", "postgresql://u@127.0.0.1:5432/x", "stats"], "postgres"),
                        (["serve", "--db", "x.db"], "server")):
        res = run_without(["psycopg", "psycopg_pool", "fastapi", "uvicorn"], f"""
            sys.argv = ["ledgerq", *{argv!r}]
            from ledgerq.cli import main
            main()
        """, tmp_path)
        assert res.returncode == 2, res.stdout + res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ledgerq: error:"), res.stderr
        assert f"pip install 'ledgerq[{extra}]'" in lines[0]


def test_version_answers_without_importing_the_command(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-X", "importtime", "-c",
                          "import sys; sys.argv = ['ledgerq', '--version']; "
                          "from ledgerq.entrypoint import main; main()"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True)
    assert res.stdout.startswith("ledgerq ")
    imported = {line.split("|")[-1].strip() for line in res.stderr.splitlines()}
    assert not {"typer", "rich", "pydantic", "ledgerq.cli", "ledgerq.store"} & imported
