"""docs/lifecycles.md is executable: its spec loads and its example runs as printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from test_docs import block

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "lifecycles.md"


def test_the_order_example_runs_as_the_page_says(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "shop_order.toml").write_text(block(DOC, "example: shop_order.toml", "toml"),
                                           encoding="utf-8")
    (tmp_path / "orders.py").write_text(block(DOC, "example: orders.py", "python"),
                                        encoding="utf-8")
    res = subprocess.run([sys.executable, "orders.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, check=False,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("refused:") and "events from shipped: deliver" in lines[0]
    assert lines[1:] == ["delivered", "None -> created order.created.placed",
                         "created -> paid order.paid.card",
                         "paid -> shipped order.shipped.carrier",
                         "shipped -> delivered order.delivered.ok"]
