"""The wheel ships specs/ as package data and a non-editable install loads them.

Builds a wheel of this repository with pip, installs it (no dependencies, no index) into a
fresh virtual environment whose runtime dependencies come from the current environment
through a .pth file (so no network is needed), and runs a snippet there that loads the
default registry. The snippet must find ledgerq and its specs under that venv's
site-packages, never in this source tree.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

from ledgerq.lifecycle import default_registry

REPO = Path(__file__).resolve().parents[2]

SNIPPET = textwrap.dedent("""
    import asyncio, json, sys
    import ledgerq
    from ledgerq import StateDB
    from ledgerq.lifecycle import (Actor, StateReason, TransitionRequest, create,
                                   default_registry, transition)
    from ledgerq.lifecycle.registry import packaged_specs_dir

    reg = default_registry()

    async def smoke():
        async with StateDB(":memory:") as db:
            actor = Actor(type="system", id="pkg")
            rid = await create(db, "schedule_run", {
                "status": "queued", "trigger_context": {}, "action_kind": "k",
                "action_args": [], "fired_at": 0.0},
                reason=StateReason(code="run.queued.submitted"), actor=actor)
            res = await transition(db, TransitionRequest(
                entity_type="schedule_run", entity_id=rid, from_state="queued",
                to_state="running", reason=StateReason(code="run.started.ok"), actor=actor,
                idempotency_key="k"), patch={"leased_by": "pkg", "lease_expires_at": 4e9})
            return res.applied

    print(json.dumps({
        "package": ledgerq.__file__,
        "specs_dir": str(packaged_specs_dir()),
        "sources": sorted(p.source for p in reg.policies()),
        "edges": {p.name: {s: sorted(t) for s, t in p.edges.items()} for p in reg.policies()},
        "applied": asyncio.run(smoke()),
        "sys_path": sys.path,
    }))
""")


def run(cmd: list[str | Path], **kw: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          timeout=300, **kw)  # type: ignore[call-overload]
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc  # type: ignore[no-any-return]


@pytest.mark.slow
def test_installed_wheel_loads_the_packaged_specs(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", wheels, REPO])
    (wheel,) = wheels.glob("ledgerq-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    spec_files = sorted(p.name for p in (REPO / "specs").glob("*.toml"))
    assert spec_files, "the repository has spec files"
    for name in spec_files:
        assert f"ledgerq/specs/{name}" in names, sorted(names)
    assert "ledgerq/py.typed" in names
    assert "ledgerq/lifecycle/registry.py" in names
    for asset in ("index.html", "app.js", "style.css"):  # the dashboard needs no build step
        assert f"ledgerq/web/static/{asset}" in names, sorted(names)
    for dialect in ("sqlite", "postgres"):  # each dialect's SQL, one file per owner
        for owner in ("events", "shared", "workers", "maintenance", "reads", "migrations"):
            assert f"ledgerq/store/{dialect}/{owner}.sql" in names, sorted(names)

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    site = Path(run([python, "-c",
                     "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    # Runtime dependencies (pydantic, msgspec, aiosqlite, transitions, ...) come from this
    # environment, appended after the venv's own site-packages.
    (site / "zz_ledgerq_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps",
         "--no-index", wheel])

    out = run([python, "-I", "-c", SNIPPET], cwd=tmp_path).stdout
    got = json.loads(out.strip().splitlines()[-1])
    installed = site / "ledgerq"
    assert Path(got["package"]).resolve() == (installed / "__init__.py").resolve()
    assert Path(got["specs_dir"]).resolve() == (installed / "specs").resolve()
    assert got["sources"] == sorted(str(installed / "specs" / n) for n in spec_files)
    for source in got["sources"]:
        assert not Path(source).resolve().is_relative_to(REPO), source
    assert str(REPO / "src") not in got["sys_path"]
    expected = {p.name: {s: sorted(t) for s, t in p.edges.items()}
                for p in default_registry().policies()}
    assert got["edges"] == expected
    assert got["applied"] is True
