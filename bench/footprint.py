"""What a user pays to install ledgerq and to start its command, per extra.

Builds a wheel of this checkout, installs it into fresh virtual environments (the core
alone, then each extra) from the package index pip is configured with, and reports:

  size      the venv's site-packages in MB, less pip and setuptools (what ledgerq and
            its dependencies take), and the number of distributions installed
  version   ``ledgerq --version``, median wall time of R runs (the console script's
            fast path: no typer, rich or engine import)
  help      ``ledgerq --help``, median wall time of R runs (every command module)
  floor     ``python -c pass`` in the same venv: the interpreter's own start-up

    .venv/bin/python bench/footprint.py              # core, postgres, server
    .venv/bin/python bench/footprint.py --extra core --rounds 21
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Installed with every venv, not by ledgerq: left out of the size.
TOOLING = ("pip", "setuptools", "pkg_resources", "_distutils_hack", "distutils-precedence.pth")


def run(cmd: list[str | Path]) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=True)
    return proc.stdout


def site_packages(venv: Path) -> Path:
    return Path(run([venv / "bin" / "python", "-c",
                     "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip())


def size_mb(site: Path) -> float:
    total = 0
    for entry in site.iterdir():
        if entry.name in TOOLING or entry.name.startswith(("pip-", "setuptools-")):
            continue
        paths = [entry] if entry.is_file() else list(entry.rglob("*"))
        total += sum(p.stat().st_size for p in paths if p.is_file())
    return total / 1e6


def timed(cmd: list[str | Path], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        subprocess.run([str(c) for c in cmd], capture_output=True, check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(wheel: Path, extra: str, rounds: int, tmp: Path) -> dict[str, float | int]:
    venv = tmp / f"venv-{extra}"
    run([sys.executable, "-m", "venv", venv])
    spec = f"{wheel}" if extra == "core" else f"ledgerq[{extra}] @ {wheel.as_uri()}"
    run([venv / "bin" / "pip", "install", "--quiet", spec])
    site = site_packages(venv)
    dists = [d for d in site.glob("*.dist-info")
             if not d.name.startswith(("pip-", "setuptools-"))]
    # Bytecode first, as an installed package has after its first run.
    run([venv / "bin" / "python", "-m", "compileall", "-q", site])
    ledgerq = venv / "bin" / "ledgerq"
    return {"size_mb": size_mb(site), "distributions": len(dists),
            "version_s": timed([ledgerq, "--version"], rounds),
            "help_s": timed([ledgerq, "--help"], rounds),
            "floor_s": timed([venv / "bin" / "python", "-c", "pass"], rounds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extra", action="append", choices=["core", "postgres", "server"])
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    extras = args.extra or ["core", "postgres", "server"]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", tmp, REPO])
        (wheel,) = tmp.glob("ledgerq-*.whl")
        print(f"{'install':10} {'MB':>6} {'dists':>6} {'--version':>10} {'--help':>8} "
              f"{'floor':>7}  (python {sys.version.split()[0]}, {os.cpu_count()} cpus)")
        for extra in extras:
            m = measure(wheel, extra, args.rounds, tmp)
            print(f"{extra:10} {m['size_mb']:6.1f} {m['distributions']:6d} "
                  f"{m['version_s']:9.3f}s {m['help_s']:7.3f}s {m['floor_s']:6.3f}s")


if __name__ == "__main__":
    main()
