"""Capabilities route and order work; they never authorize it.

Pure functions here; how the worker applies them to rows is in test_queue_worker.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledgerq.queue import (
    CAPABILITY_CLASSES,
    DEFAULT_CAPABILITY_CLASS,
    affinity_score,
    host_scoped_concurrency_key,
    worker_can_serve,
)

GPU = "gpu-exclusive"  # serialization
WARM = "warmed-cache"  # affinity


# ----------------------------------------------------------------- the declarative map


def test_capability_classes_are_the_records_map() -> None:
    assert CAPABILITY_CLASSES == {GPU: "serialization", WARM: "affinity"}
    assert DEFAULT_CAPABILITY_CLASS == "eligibility"


# ----------------------------------------------------------------- worker_can_serve


@pytest.mark.parametrize(("required", "advertised", "expected"), [
    (None, None, True),
    ([], [], True),
    ([], None, True),
    (None, ["anything"], True),
    # unknown tokens are eligibility tokens: they must be advertised
    (["cuda-12"], [], False),
    (["cuda-12"], None, False),
    (["cuda-12"], ["cuda-12"], True),
    (["cuda-12"], ["cuda-11"], False),
    # every eligibility token must be advertised (subset), extra advertisements are fine
    (["a", "b"], ["a"], False),
    (["a", "b"], ["b", "a", "c"], True),
    # duplicates in the requirement do not change the answer
    (["a", "a"], ["a"], True),
    # serialization tokens filter like eligibility tokens
    ([GPU], [], False),
    ([GPU], [GPU], True),
    ([GPU, "a"], [GPU], False),
    # affinity tokens never filter
    ([WARM], [], True),
    ([WARM], None, True),
    ([WARM, WARM], [], True),
    ([WARM, "a"], ["a"], True),
    ([WARM, "a"], [WARM], False),
    # tokens are compared exactly (no case folding, no trimming)
    (["GPU"], ["gpu"], False),
    ([" a"], ["a"], False),
])
def test_worker_can_serve(required: list[str] | None, advertised: list[str] | None,
                          expected: bool) -> None:
    assert worker_can_serve(required, advertised) is expected


def test_worker_can_serve_takes_any_iterable() -> None:
    assert worker_can_serve(iter(["a", WARM]), (t for t in ["a"]))
    assert worker_can_serve(("a",), frozenset({"a"}))
    assert not worker_can_serve({"a", "b"}, iter(["a"]))


# ----------------------------------------------------------------- affinity_score


@pytest.mark.parametrize(("required", "advertised", "expected"), [
    (None, None, 0),
    ([], [WARM], 0),
    ([WARM], None, 0),
    ([WARM], [], 0),
    ([WARM], [WARM], 1),
    # eligibility and serialization tokens never score, advertised or not
    (["a", GPU], ["a", GPU], 0),
    (["a", GPU, WARM], ["a", GPU, WARM], 1),
    (["a", GPU, WARM], ["a", GPU], 0),
])
def test_affinity_score(required: list[str] | None, advertised: list[str] | None,
                        expected: int) -> None:
    assert affinity_score(required, advertised) == expected


def test_affinity_score_counts_matching_affinity_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    # The map is the one place a token's meaning lives: a new affinity token needs no code.
    monkeypatch.setitem(CAPABILITY_CLASSES, "numa-local", "affinity")
    assert affinity_score([WARM, "numa-local"], [WARM, "numa-local"]) == 2
    assert affinity_score([WARM, "numa-local"], ["numa-local"]) == 1
    assert affinity_score([WARM, "numa-local"], []) == 0
    # and it still never filters
    assert worker_can_serve([WARM, "numa-local"], [])


# ----------------------------------------------------------------- host_scoped_concurrency_key


@pytest.mark.parametrize(("required", "expected"), [
    (None, None),
    ([], None),
    (["a", "b"], None),  # eligibility tokens do not serialize
    ([WARM], None),  # nor do affinity tokens
    ([GPU], "node-1:gpu-exclusive"),
    (["a", GPU, WARM], "node-1:gpu-exclusive"),
    # the same resource twice is still the same resource: same key as one token
    ([GPU, GPU], "node-1:gpu-exclusive"),
])
def test_host_scoped_concurrency_key(required: list[str] | None, expected: str | None) -> None:
    assert host_scoped_concurrency_key("node-1", required) == expected


def test_concurrency_key_is_host_scoped() -> None:
    assert host_scoped_concurrency_key("h1", [GPU]) == "h1:gpu-exclusive"
    assert host_scoped_concurrency_key("h2", [GPU]) == "h2:gpu-exclusive"
    assert host_scoped_concurrency_key("h1", [GPU]) != host_scoped_concurrency_key("h2", [GPU])


def test_concurrency_key_sorts_and_joins_serialization_tokens(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(CAPABILITY_CLASSES, "tpu-exclusive", "serialization")
    monkeypatch.setitem(CAPABILITY_CLASSES, "a-port", "serialization")
    expected = "h:a-port+gpu-exclusive+tpu-exclusive"
    assert host_scoped_concurrency_key("h", ["tpu-exclusive", GPU, "a-port"]) == expected
    assert host_scoped_concurrency_key("h", [GPU, "a-port", "tpu-exclusive", "x"]) == expected
    assert host_scoped_concurrency_key("h", iter(["tpu-exclusive", WARM, GPU])) == \
        "h:gpu-exclusive+tpu-exclusive"


# ----------------------------------------------------------------- properties

_TOKENS = st.sampled_from([GPU, WARM, "a", "b", "cuda-12"])


@given(required=st.lists(_TOKENS, max_size=6), advertised=st.lists(_TOKENS, max_size=6))
def test_routing_properties(required: list[str], advertised: list[str]) -> None:
    classes = {t: CAPABILITY_CLASSES.get(t, DEFAULT_CAPABILITY_CLASS) for t in required}
    hard = {t for t in required if classes[t] != "affinity"}
    assert worker_can_serve(required, advertised) == (hard <= set(advertised))
    # adding or removing affinity tokens never changes eligibility
    can = worker_can_serve(required, advertised)
    assert worker_can_serve([*required, WARM], advertised) == can
    assert worker_can_serve([t for t in required if t != WARM], advertised) == can
    score = affinity_score(required, advertised)
    assert 0 <= score <= sum(1 for t in required if classes[t] == "affinity")
    if WARM not in advertised:
        assert score == 0
    serial = sorted({t for t in required if classes[t] == "serialization"})
    key = host_scoped_concurrency_key("h", required)
    assert key == (f"h:{'+'.join(serial)}" if serial else None)
    # order of the requirement never changes the key
    assert host_scoped_concurrency_key("h", list(reversed(required))) == key
