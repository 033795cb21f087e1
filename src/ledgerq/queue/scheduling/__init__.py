"""Schedules: their rows, when their slots fall, and the pass that fires them."""
