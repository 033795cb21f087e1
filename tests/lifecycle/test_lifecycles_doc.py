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


def test_the_migration_part_runs_as_the_page_says(tmp_path: Path) -> None:
    """The tutorial's second part on the first part's database: the plan is what the
    page shows, and opening with the edited file migrates it with the order kept."""
    test_the_order_example_runs_as_the_page_says(tmp_path)
    spec = tmp_path / "specs" / "shop_order.toml"
    text = spec.read_text(encoding="utf-8")
    codes = block(DOC, "example: shop_order_hold_codes.toml", "toml")
    text = text.replace("[reason_codes]\n", "[reason_codes]\n" + codes, 1)
    spec.write_text(text + "\n" + block(DOC, "example: shop_order_hold.toml", "toml"),
                    encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    command = block(DOC, "example: plan.sh", "sh").split()
    assert command[0] == "ledgerq"
    plan = subprocess.run([sys.executable, "-m", "ledgerq", *command[1:]], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, env=env, check=False)
    assert plan.returncode == 0, plan.stderr
    shown = DOC.read_text(encoding="utf-8").split("<!-- example: plan.sh", 1)[1]
    expected = shown.split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    assert [ln for ln in plan.stdout.splitlines() if ln.strip()] == expected
    (tmp_path / "hold.py").write_text(block(DOC, "example: hold.py", "python"),
                                      encoding="utf-8")
    res = subprocess.run([sys.executable, "hold.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, env=env, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["created -> paid -> on_hold -> paid",
                                       "1 delivered before"]


def test_the_on_enter_part_runs_through_a_real_worker(tmp_path: Path) -> None:
    """The receipt deferred by paying an order, run by a real ``ledgerq worker`` process
    serving the page's app, on the first part's database."""
    test_the_order_example_runs_as_the_page_says(tmp_path)
    spec = tmp_path / "specs" / "shop_order.toml"
    paid = '[states.paid]\ndescription = "Paid, not shipped."\n'
    text = spec.read_text(encoding="utf-8")
    assert paid in text
    spec.write_text(text.replace(paid, block(DOC, "example: shop_order_paid.toml", "toml")),
                    encoding="utf-8")
    for name in ("tasks.py", "pay.py"):
        (tmp_path / name).write_text(block(DOC, f"example: {name}", "python"),
                                     encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{tmp_path}"}
    pay, work = block(DOC, "example: receipt.sh", "sh").splitlines()
    assert pay.split()[0] == "python" and work.split()[0] == "ledgerq"
    paid_run = subprocess.run([sys.executable, *pay.split()[1:]], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60, env=env, check=False)
    assert paid_run.returncode == 0, paid_run.stderr
    oid = paid_run.stdout.strip()
    worker = subprocess.run([sys.executable, "-m", "ledgerq", *work.split()[1:]],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env=env, check=False)
    assert worker.returncode == 0, worker.stderr
    assert f"receipt for {oid}: created -> paid by webhook" in worker.stdout
    check = subprocess.run([sys.executable, "-m", "ledgerq", "specs", "check", "specs",
                            "--db", "shop.db"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60, env=env, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
