"""Capability labels route and order work; they never authorize it.

One declarative map says what each token means for placement, so no token name is
branched on anywhere else in submit or worker code.
"""

from __future__ import annotations

from collections.abc import Iterable

DEFAULT_CAPABILITY_CLASS = "eligibility"

#: token -> class; unknown tokens are eligibility tokens.
CAPABILITY_CLASSES: dict[str, str] = {
    "gpu-exclusive": "serialization",
    "warmed-cache": "affinity",
}


def capability_class(token: str) -> str:
    return CAPABILITY_CLASSES.get(token, DEFAULT_CAPABILITY_CLASS)


def worker_can_serve(required_capabilities: Iterable[str] | None,
                     advertised_capabilities: Iterable[str] | None) -> bool:
    """Eligibility and serialization tokens must all be advertised; affinity never filters."""
    advertised = set(advertised_capabilities or ())
    return all(
        token in advertised
        for token in required_capabilities or ()
        if capability_class(token) != "affinity"
    )


def affinity_score(required_capabilities: Iterable[str] | None,
                   advertised_capabilities: Iterable[str] | None) -> int:
    """How many of the task's affinity tokens the worker advertises (higher claims first)."""
    advertised = set(advertised_capabilities or ())
    return sum(
        1 for token in required_capabilities or ()
        if capability_class(token) == "affinity" and token in advertised
    )


def host_scoped_concurrency_key(host: str, required_capabilities: Iterable[str] | None
                                ) -> str | None:
    """``host:tokA+tokB`` from the sorted serialization tokens, or None when there are none."""
    tokens = sorted({t for t in required_capabilities or ()
                     if capability_class(t) == "serialization"})
    if not tokens:
        return None
    return f"{host}:{'+'.join(tokens)}"
