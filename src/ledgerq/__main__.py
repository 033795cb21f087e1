"""``python -m ledgerq`` runs the ``ledgerq`` command (the demo starts its workers this way)."""

from ledgerq.cli import main

if __name__ == "__main__":
    main()
