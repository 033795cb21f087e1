"""Retention without breaking the log: ended runs and all their facts move to a file.

``archive_runs(db, before=...)`` moves every run in a terminal state (the spec's) whose
last move is older than ``before`` out of the live tables, with every fact of it, into
one archive file (:mod:`ledgerq.store.sqlite.archive_file`), and records the step in
``ledgerq_archives``. Why a run and its whole history go together: ``verify`` folds an
entity's facts into its row, so a row without its facts (or facts without their row)
would be drift; moving both keeps projection == fold(log) for what remains.

The order, and why no crash loses data or archives twice:

1. One write transaction (SQLite's write lock; on PostgreSQL an archive lock and the
   chosen rows locked ``FOR UPDATE``) lists the runs in ``ledgerq_archive_batch`` and
   takes off the list every run a staying row still refers to (a chained retry's
   ``chain_parent_id``, another entity's foreign key, a staying run's ``depends_on``, a
   worker's lease), or whose idempotency key is still to answer, and every run a run so
   kept refers to: a chain is archived whole or not at all, and those kept are counted as
   skipped.
2. Inside that transaction the listed rows and facts are copied from the same snapshot
   into ``FILE.partial``, which is fsynced; the database's record of the step is
   inserted; the facts and rows are deleted (the log's DELETE guard admits exactly the
   listed entities), the counts deleted must equal the counts written, and the list is
   emptied; only then is the file renamed to ``FILE`` (and the directory fsynced), and
   the transaction commits.
3. A failure before the commit removes the file; a commit whose outcome is unknown (the
   connection died during COMMIT) keeps it unless the database shows the step was not
   recorded.

So after a crash at any moment either nothing was deleted (at most a ``.partial`` file,
or a complete ``FILE`` whose id the database never recorded, is left: its runs are all
still live) or everything was deleted, recorded, and ``FILE`` is complete. A rerun finds
the runs already gone (deleted once, in the transaction that recorded the file) and
never overwrites a file.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ledgerq import __version__
from ledgerq.durations import check_span, parse_duration, parse_instant
from ledgerq.errors import DatabaseError, InvalidInput
from ledgerq.lifecycle import evolution
from ledgerq.lifecycle.ids import new_id
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.queue.dependencies import depends_on
from ledgerq.queue.reads import RUN_ENTITY, decode_fact, decode_row
from ledgerq.store.sqlite import archive_file

if TYPE_CHECKING:
    from ledgerq.lifecycle.store import Database
    from ledgerq.queue.maintenance.store import MaintenanceTx


@dataclass(frozen=True)
class ArchiveSummary:
    """What one archive moved (or, ``dry_run``, would move)."""

    id: str | None
    file: str | None
    before: float
    runs: int
    facts: int
    #: Ended before ``before`` but kept: a staying row still refers to them, or their
    #: idempotency key is still to answer (``keyed`` of them, with what they refer to).
    skipped: int
    dry_run: bool = False
    ids_sha256: str | None = None
    keyed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parse_before(text: str, *, now: float | None = None) -> float:
    """``--before``: an ISO 8601 time, or a span back from now (``30d``, ``12h``)."""
    try:
        return (time.time() if now is None else now) - parse_duration(text, "--before")
    except InvalidInput:
        pass
    try:
        return parse_instant(text, "--before")
    except InvalidInput:
        raise InvalidInput(f"--before: {text!r} is neither an ISO 8601 time (e.g. "
                           "2026-11-01 or 2026-11-01T00:00:00+00:00) nor a span back from "
                           "now (e.g. 30d, 12h)") from None


def default_file(db: Database[MaintenanceTx], now: float) -> Path:
    """``ledgerq-archive-<UTC time>.sqlite`` beside the SQLite file (else here)."""
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%SZ")
    where = Path(db.file).resolve().parent if db.file is not None else Path.cwd()
    return where / f"ledgerq-archive-{stamp}.sqlite"


def _referrers(db: Database[MaintenanceTx], policy: EntityPolicy) -> list[tuple[EntityPolicy, str]]:
    """Every (entity, column) whose foreign key points at the run table (the specs')."""
    return [(p, c) for p in db.registry.policies() for c, col in p.columns.items()
            if col.references == policy.table]


def _select(tx: MaintenanceTx, policy: EntityPolicy, referrers: list[tuple[EntityPolicy, str]],
            before: float, limit: int | None, keys_since: float) -> tuple[int, int, int]:
    """List the runs to archive; (listed, skipped, of those skipped the keyed ones)."""
    tx.lock_archives()
    tx.clear_marks()
    listed = tx.mark_ended(policy, sorted(policy.terminal), before, limit)
    if not listed:
        return 0, 0, 0
    keyed = tx.list_marked_keyed(policy, keys_since)
    kept = _kept(tx, policy, referrers, set(tx.list_marked(policy.name)), keyed)
    tx.unmark(policy.name, sorted(kept))
    return listed - len(kept), len(kept), len(keyed)


def _kept(tx: MaintenanceTx, policy: EntityPolicy, referrers: list[tuple[EntityPolicy, str]],
          listed: set[str], keyed: list[str]) -> set[str]:
    """The listed runs a staying row still refers to, directly or through other kept runs.

    A run that stays refers on (its ``chain_parent_id``, its ``depends_on``), so a chain
    is kept whole or archived whole. Every reference is read once and the closure taken
    in memory: linear in the references, where taking runs off one level of a chain per
    statement was quadratic in its length (6,000 kept runs held the write lock 30 s).
    """
    onward: dict[str, list[str]] = {}  # listed run -> the runs it refers to
    seeds = {r for r in tx.list_leased_runs() if r in listed} | set(keyed)

    def refers(rid: str, targets: list[str]) -> None:
        if rid in listed:
            onward.setdefault(rid, []).extend(targets)
        else:  # a staying row: what it names stays
            seeds.update(t for t in targets if t in listed)

    for referrer, column in referrers:
        for rid, target in tx.list_references(referrer, column):
            if referrer.name == policy.name:
                refers(rid, [target])
            elif target in listed:
                seeds.add(target)
    for rid, raw in tx.list_depends_on(policy):
        refers(rid, depends_on(raw) or [])
    kept: set[str] = set()
    todo = list(seeds)
    while todo:
        rid = todo.pop()
        if rid not in kept:
            kept.add(rid)
            todo += (t for t in onward.get(rid, ()) if t in listed)
    return kept


async def archive_runs(db: Database[MaintenanceTx], *, before: float, to: str | Path | None = None,
                       dry_run: bool = False, limit: int | None = None,
                       keys_expire_after: float | None = None,
                       now: float | None = None) -> ArchiveSummary:
    """Move ended runs older than ``before`` and all their facts into the file ``to``
    (default :func:`default_file`), in one transaction; see the module docstring.

    ``limit`` takes only the oldest that many (before the referenced ones are taken off):
    the transaction holds SQLite's write lock while it copies, so a large backlog is
    better archived in several calls than in one that keeps every writer waiting.

    A run submitted with an idempotency key stays live while its key is to answer: by
    default always (an archived run's key no longer finds it, and a submit with the key
    would run the task again); with ``keys_expire_after`` (seconds), once it was created
    that long ago, after which its key may be used afresh.

    Refused (InvalidInput, nothing written) when ``to`` exists or its directory does not.
    Nothing to move writes no file and records nothing.
    """
    if not isinstance(before, int | float) or not math.isfinite(before):
        raise InvalidInput(f"before must be a finite epoch time, not {before!r}")
    if keys_expire_after is not None:
        check_span(keys_expire_after, "keys_expire_after")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or limit < 1):
        raise InvalidInput(f"limit must be a positive number of runs, not {limit!r}")
    started = time.time() if now is None else now
    keys_since = -math.inf if keys_expire_after is None else started - keys_expire_after
    policy = db.registry.entity(RUN_ENTITY)
    referrers = _referrers(db, policy)
    path = Path(to) if to is not None else default_file(db, started)
    if not dry_run:
        await _check_target(db, path)
    batch = new_id()
    manifest = {
        "archive_id": batch, "ledgerq_version": __version__, "entity": policy.name,
        "table": policy.table, "spec_hash": evolution.spec_hash(evolution.policy_normal(policy)),
        "dialect": db.dialect, "before": repr(float(before)),
        "before_iso": datetime.fromtimestamp(before, UTC).isoformat(),
        "created_at": repr(started),
    }
    types = {c: col.type for c, col in policy.columns.items()}
    published = [False]

    def unit(tx: MaintenanceTx) -> ArchiveSummary:
        runs, skipped, keyed = _select(tx, policy, referrers, float(before), limit,
                                       keys_since)
        if dry_run or runs == 0:
            facts = sum(1 for _ in tx.stream_marked_facts(policy.name)) if runs else 0
            tx.clear_marks()
            return ArchiveSummary(None, None, before, runs, facts, skipped, dry_run,
                                  keyed=keyed)
        try:
            wrote, facts, digest = archive_file.write(
                path, manifest, policy.table, types, tx.stream_marked_rows(policy),
                tx.stream_marked_facts(policy.name))
            if wrote != runs:
                raise DatabaseError(f"archive {batch}: listed {runs} runs but copied {wrote}; "
                                    "nothing was deleted")
            tx.record_archive({
                "id": batch, "created_at": started, "ended_before": float(before),
                "file": str(path.resolve()), "entity_type": policy.name, "runs": runs,
                "facts": facts, "skipped": skipped, "ids_sha256": digest,
                "ledgerq_version": __version__})
            deleted = tx.delete_marked(policy)
            if deleted != (facts, runs):
                raise DatabaseError(f"archive {batch}: copied {facts} facts of {runs} runs "
                                    f"but would delete {deleted[0]} facts of {deleted[1]}; "
                                    "nothing was deleted")
            tx.clear_marks()
            archive_file.publish(path)
            published[0] = True
        except BaseException:
            archive_file.remove(path, published=published[0])
            published[0] = False
            raise
        return ArchiveSummary(batch, str(path.resolve()), before, runs, facts, skipped,
                              False, digest, keyed)

    try:
        return await db.write(unit, bulk=True)
    except BaseException:
        # The unit returned, the commit failed: the file is ours, and is removed unless
        # the commit may have happened after all.
        if published[0] and not await _recorded(db, batch):
            archive_file.remove(path, published=True)
        raise


async def _check_target(db: Database[MaintenanceTx], path: Path) -> None:
    if not path.parent.is_dir():
        raise InvalidInput(f"--to: directory {path.parent} does not exist")
    if path.is_symlink() and not path.exists():
        raise InvalidInput(f"{path} is a symbolic link to {os.readlink(path)}, which does "
                           "not exist; an archive never replaces a link: give the file's "
                           "own path as --to")
    if path.exists():
        recorded = [a for a in await list_archives(db) if a["file"] == str(path.resolve())]
        why = (f"it is archive {recorded[0]['id']} of this database" if recorded else
               "this database records no archive there (if it is a ledgerq archive, an "
               "interrupted one: its runs are still live)")
        raise InvalidInput(f"{path} already exists ({why}); an archive never overwrites a "
                           "file: choose another --to")


async def _recorded(db: Database[MaintenanceTx], batch: str) -> bool:
    """Whether the database recorded ``batch`` (True, keeping the file, when it cannot
    say: a file that may be the only copy of deleted runs is never removed)."""
    try:
        return any(a["id"] == batch for a in await list_archives(db))
    except Exception:
        return True


async def list_archives(db: Database[MaintenanceTx]) -> list[dict[str, Any]]:
    """Every archive this database recorded, oldest first."""
    return await db.read(lambda tx: tx.list_archives())


@dataclass(frozen=True)
class ArchivedRun:
    """One run looked up in an archive file: its row and history, decoded."""

    run: dict[str, Any]
    history: list[dict[str, Any]]
    manifest: dict[str, str]


def read_archived_run(path: str | Path, run_id: str, policy: EntityPolicy) -> ArchivedRun:
    """The run ``run_id`` (or a unique prefix/suffix of 4+ characters) of an archive file.

    NotAnArchive (InvalidInput) when the file is not a complete ledgerq archive,
    NotFound when the id is not in it."""
    with archive_file.ArchiveFile(Path(path)) as archive:
        full = archive.resolve(run_id)
        row = decode_row(policy, archive.run(full))
        return ArchivedRun(row, [decode_fact(f) for f in archive.facts(full)],
                           dict(archive.manifest))
