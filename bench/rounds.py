"""A target's ratio over interleaved rounds, as every benchmark here reports it.

Each round runs every system once, so drift on the machine hits both sides of a ratio
alike; the figure judged is the median of the rounds' own ratios, shown with their
spread.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import NamedTuple


class Ratio(NamedTuple):
    """The median of each round's own ratio, and the lowest and highest of them."""

    median: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.median:.2f}x [{self.low:.2f}, {self.high:.2f}]"


def ratio(tops: Sequence[float], bottoms: Sequence[float]) -> Ratio:
    """``tops`` over ``bottoms``, round by round (the same rounds, in order)."""
    rs = [a / b for a, b in zip(tops, bottoms, strict=True)]
    return Ratio(statistics.median(rs), min(rs), max(rs))
