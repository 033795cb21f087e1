"""Submission: a TaskApplication validated once and written with its creation fact;
cancellation and reruns."""
