"""The console script's entry point: ``ledgerq --version`` answers before the command's
modules (typer, rich, the engine) are imported, so scripts and health checks that ask
for the version pay a Python start-up, not the whole command's."""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        from ledgerq import __version__

        sys.stdout.write(f"ledgerq {__version__}\n")
        return
    from ledgerq.cli import main as run

    run()


__all__ = ["main"]
