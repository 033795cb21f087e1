"""The worker: claims under leases, supervision of what runs, outcomes, the Worker service."""
