"""Peers and harness for bench/postgres.py (imported with bench/ appended to sys.path)."""
