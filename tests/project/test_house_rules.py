"""The product speaks of itself, not of its making.

Comments, docstrings, docs and bench output say what is true now and why; they do not
point at work sessions, tracker issues or issue numbers, nor at a document a reader of
the repository cannot open (a decision record: src/ names the ADR-0071 queue instead,
which docs/compatibility.md describes).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: What is searched: these trees, and these single files.
TREES = ("src", "docs", "tests", "bench")
FILES = ("README.md",)
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis"}

# Built from pieces, so that this file's own source never matches it.
_SESSION = "ses" + "sion [0-9]"
_ISSUE = "iss" + "ue [0-9]"
_NUMBER = "#" + "[0-9]{2}" + r"\b"
MAKING = re.compile("|".join((_SESSION, _ISSUE, _NUMBER)), re.IGNORECASE)
RECORD = re.compile(r"\bthe " + "rec" + r"ord\b", re.IGNORECASE)


def text_files(*roots: str) -> Iterator[Path]:
    """Every text file under ``roots`` (directories or files, relative to the repository):
    a file that is not UTF-8, or has a NUL byte (an image, a database), is skipped."""
    for name in roots:
        top = ROOT / name
        paths = [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []
        for path in paths:
            if not path.is_file() or SKIP_DIRS.intersection(path.relative_to(ROOT).parts):
                continue
            if path.suffix in {".pyc", ".png", ".jpg", ".gif", ".ico", ".sqlite", ".db"}:
                continue
            yield path


def hits(pattern: re.Pattern[str], *roots: str) -> list[str]:
    """``file:line: text`` for every line under ``roots`` that ``pattern`` matches."""
    found = []
    for path in text_files(*roots):
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_no_sessions_issues_or_issue_numbers() -> None:
    found = hits(MAKING, *TREES, *FILES)
    assert not found, ("say what is true now and why, not which session or issue made "
                       "it:\n" + "\n".join(found))


def test_src_does_not_cite_the_record() -> None:
    found = hits(RECORD, "src")
    assert not found, ("say the thing directly, or name the ADR-0071 queue "
                       "(docs/compatibility.md):\n" + "\n".join(found))
