"""Maintenance passes: expired leases, due retries and dependencies, stuck rows, archiving."""
