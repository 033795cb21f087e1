"""``ledgerq archive`` and ``ledgerq show --archive``, end to end in a subprocess."""

from __future__ import annotations

import json
from pathlib import Path

from test_cli import as_json, cli, counts, ok, one_error_line


def submit_and_cancel(db: Path, n: int) -> list[str]:
    ids = []
    for _ in range(n):
        rid = ok("submit", "--db", db, "command", "--", "true").stdout.strip()
        ok("cancel", "--db", db, rid)
        ids.append(rid)
    return ids


def test_archive_round_trip_through_the_command(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    ended = submit_and_cancel(db, 3)
    live = ok("submit", "--db", db, "command", "--", "true").stdout.strip()
    ok("verify", "--db", db)

    dry = as_json("archive", "--db", db, "--before", "0s", "--dry-run")
    assert (dry["runs"], dry["facts"], dry["dry_run"], dry["file"]) == (3, 6, True, None)
    assert counts(db) == (4, 7)

    # No --to: a timestamped file beside the database, named on stdout.
    res = ok("archive", "--db", db, "--before", "0s")
    (made,) = tmp_path.glob("ledgerq-archive-*.sqlite")
    assert str(made) in res.stdout and "archived 3 run(s) and 6 fact(s)" in res.stdout
    assert counts(db) == (1, 1)
    assert "no drift" in ok("verify", "--db", db).stdout

    listed = as_json("archive", "--db", db, "--list")["archives"]
    assert [(a["file"], a["runs"], a["facts"]) for a in listed] == [(str(made), 3, 6)]
    assert str(made) in ok("archive", "--db", db, "--list").stdout

    shown = as_json("show", "--archive", made, ended[1])
    assert shown["run"]["id"] == ended[1] and shown["run"]["status"] == "cancelled"
    assert [f["status"] for f in shown["history"]] == ["queued", "cancelled"]
    assert shown["archive"]["archive_id"] == listed[0]["id"]
    human = ok("show", "--archive", made, ended[1][-6:])
    assert "history (2 facts)" in human.stdout and "run.cancelled.operator" in human.stdout
    # The live run is not in the file; the archived one is no longer live.
    one_error_line(cli("show", "--archive", made, live), 1)
    one_error_line(cli("show", "--db", db, ended[1]), 1)
    assert ok("show", "--db", db, live, "--json").stdout

    # A rerun with nothing old enough writes no file and records nothing.
    again = as_json("archive", "--db", db, "--before", "0s", "--to", tmp_path / "b.sqlite")
    assert (again["runs"], again["file"]) == (0, None)
    assert not (tmp_path / "b.sqlite").exists()
    assert len(as_json("archive", "--db", db, "--list")["archives"]) == 1


def test_a_keyed_run_is_kept_until_its_window_passes(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    rid = ok("submit", "--db", db, "--idempotency-key", "k1", "command", "--",
             "true").stdout.strip()
    ok("cancel", "--db", db, rid)
    kept = ok("archive", "--db", db, "--before", "0s", "--dry-run").stdout
    assert "1 kept" in kept and "idempotency key still answers: 1" in kept, kept
    gone = as_json("archive", "--db", db, "--before", "0s", "--keys-expire-after", "0s")
    assert (gone["runs"], gone["keyed"]) == (1, 0)


def test_archive_refusals_are_one_line_and_write_nothing(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    submit_and_cancel(db, 1)
    taken = tmp_path / "taken.sqlite"
    taken.write_text("not mine")
    for args, code, words in [
        (("--before", "whenever"), 2, "neither an ISO 8601 time"),
        ((), 2, "give --before"),
        (("--before", "0s", "--to", taken), 2, "already exists"),
        (("--before", "0s", "--to", tmp_path / "no" / "x.sqlite"), 2, "does not exist"),
        (("--list", "--before", "0s"), 2, "--list takes no"),
        (("--before", "0s", "--limit", "0"), 2, "--limit"),
        (("--before", "0s", "--keys-expire-after", "soon"), 2, "--keys-expire-after"),
    ]:
        line = one_error_line(cli("archive", "--db", db, *args), code)
        assert words in line, line
    assert counts(db) == (1, 2)
    assert taken.read_text() == "not mine"
    assert list(tmp_path.glob("ledgerq-archive-*")) == []
    # show --archive on what is not an archive, or an id it lacks.
    assert "not a ledgerq archive" in one_error_line(cli("show", "--archive", taken, "x"), 1)
    assert "not a ledgerq archive" in one_error_line(cli("show", "--archive", db, "x"), 1)
    assert "no archive file" in one_error_line(
        cli("show", "--archive", tmp_path / "none.sqlite", "x"), 1)
    ok("archive", "--db", db, "--before", "2999-01-01", "--to", tmp_path / "a.sqlite")
    line = one_error_line(cli("show", "--archive", tmp_path / "a.sqlite", "abcdef"), 1)
    assert "no run abcdef in archive" in line
    assert json.loads(ok("verify", "--db", db, "--json").stdout)["ok"] is True


def test_archive_file_failures_name_the_file(tmp_path: Path) -> None:
    """A dangling symbolic link as --to is refused (the link was replaced, and its target
    recorded); a file that cannot be written (/proc takes none) is named as the archive's
    failure, not the live database's, in one line; nothing is archived either way."""
    db = tmp_path / "state.db"
    submit_and_cancel(db, 1)
    link = tmp_path / "link.sqlite"
    link.symlink_to(tmp_path / "elsewhere" / "gone.sqlite")
    line = one_error_line(cli("archive", "--db", db, "--before", "0s", "--to", link), 2)
    assert "symbolic link" in line, line
    assert link.is_symlink() and not link.exists()
    line = one_error_line(cli("archive", "--db", db, "--before", "0s", "--to",
                              "/proc/ledgerq-archive.sqlite"), 1)
    assert "cannot write the archive /proc/ledgerq-archive.sqlite" in line, line
    assert str(db) not in line
    assert counts(db) == (1, 2)
    assert as_json("archive", "--db", db, "--list")["archives"] == []


def test_archive_through_the_command_on_postgresql(pg_target: str, tmp_path: Path) -> None:
    ids = []
    for _ in range(2):
        rid = ok("submit", "--db", pg_target, "command", "--", "true").stdout.strip()
        ok("cancel", "--db", pg_target, rid)
        ids.append(rid)
    # No --to on PostgreSQL: the file goes in the current directory.
    done = json.loads(ok("archive", "--db", pg_target, "--before", "0s", "--json",
                         cwd=tmp_path).stdout)
    assert (done["runs"], done["facts"]) == (2, 4)
    assert Path(done["file"]).parent == tmp_path.resolve()
    assert json.loads(ok("verify", "--db", pg_target, "--json").stdout)["ok"] is True
    shown = as_json("show", "--archive", done["file"], ids[0])
    assert shown["archive"]["dialect"] == "postgresql"
    assert [f["status"] for f in shown["history"]] == ["queued", "cancelled"]
    assert one_error_line(cli("show", "--db", pg_target, ids[0]), 1)
