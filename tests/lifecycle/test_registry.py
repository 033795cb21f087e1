"""The policy registry: packaged specs, every refusal rule, immutability, schema CHECKs."""

from __future__ import annotations

import dataclasses
import sqlite3
import tomllib
from pathlib import Path

import msgspec
import pytest

from ledgerq import StateDB
from ledgerq.lifecycle import Registry, SpecError, default_registry, load_registry
from ledgerq.lifecycle.diagrams import mermaid
from ledgerq.lifecycle.registry import packaged_specs_dir
from ledgerq.lifecycle.spec import EntitySpec, decode_spec
from lifecycle_support import with_dispatch

REPO = Path(__file__).resolve().parents[2]
BROKEN = Path(__file__).resolve().parents[1] / "specs_broken"

# The minimal valid spec every file under specs_broken/ is derived from (one rule broken each).
BASELINE = """\
entity = "widget"
table = "widgets"
description = "A minimal valid spec; each broken file differs from it in one rule."
initial = ["new"]
terminal = ["done"]
guard_columns = ["owner"]
patch_columns = ["owner", "note"]

[states.new]
description = "Just made."
[states.busy]
description = "Being worked on."
[states.done]
description = "Finished."

[[edges]]
from = "new"
to = ["busy", "done"]

[[edges]]
from = "busy"
to = ["done"]
requires_guard = ["owner"]
requires_patch = ["note"]

[reason_codes]
"widget.new.created" = "Created."
"widget.done.ok" = "Finished."

[columns]
owner = "text"
note = "text"
"""

SCHEDULE_RUN_EDGES = {
    "queued": {"waiting_dependency", "running", "skipped", "cancelled"},
    "waiting_dependency": {"queued", "cancelled"},
    "running": {"completed", "failed", "timed_out", "retry_wait", "queued", "cancelled",
                "running"},
    "retry_wait": {"queued", "cancelled"},
    # Beyond the ADR-0071 queue: a delayed run (one with a start time) waits here.
    "delayed": {"queued", "cancelled"},
    "completed": set(),
    "failed": set(),
    "timed_out": set(),
    "skipped": set(),
    "cancelled": set(),
}

DISPATCH_EDGES = {
    "pending": {"delivering", "expired", "acked"},
    "delivering": {"delivering", "pending", "delivered", "acked", "dead_letter", "expired"},
    "dead_letter": {"pending"},
    "expired": {"pending"},
    "delivered": set(),
    "acked": set(),
}


# ---------------------------------------------------------------- packaged specs


def test_default_registry_loads_packaged_specs() -> None:
    reg = default_registry()
    assert isinstance(reg, Registry)
    # The docs' example outbox (dispatch) is opt-in, not packaged.
    assert sorted(reg.entities) == ["schedule", "schedule_run"]
    assert reg is default_registry(), "built once per process"
    # In a source checkout the packaged specs are the repository's specs/.
    explicit = load_registry(REPO / "specs")
    for name in reg.entities:
        a, b = reg.entity(name), explicit.entity(name)
        assert (a.table, dict(a.edges), a.initial, a.terminal) == (
            b.table, dict(b.edges), b.initial, b.terminal)


def test_load_registry_none_is_the_packaged_specs() -> None:
    assert sorted(load_registry().entities) == sorted(default_registry().entities)
    assert sorted(load_registry(None).entities) == ["schedule", "schedule_run"]


def test_schedule_run_graph_matches_the_record() -> None:
    p = default_registry().entity("schedule_run")
    assert p.table == "schedule_runs"
    assert set(p.states) == set(SCHEDULE_RUN_EDGES)
    assert {s: set(t) for s, t in p.edges.items()} == SCHEDULE_RUN_EDGES
    assert p.terminal == frozenset({"completed", "failed", "timed_out", "skipped", "cancelled"})
    assert p.initial == frozenset({"queued", "waiting_dependency", "delayed", "running",
                                   "failed", "skipped"})
    for t in p.terminal:
        assert p.edges[t] == frozenset(), f"terminal {t} has outgoing edges"
    # No actor restrictions on schedule_run edges. Only the claim requires columns: the
    # lease the reaper watches, with an engine-minted fencing token.
    for (src, dst), rule in p.edge_rules.items():
        assert rule.actors is None, (src, dst)
        if (src, dst) == ("queued", "running"):
            assert rule.requires_patch == {"leased_by", "lease_expires_at"}
            assert rule.fresh_tokens == {"lease_token"}
            continue
        assert not rule.requires_guard and not rule.requires_patch, (src, dst)
    assert set(p.edge_rules) == {(s, d) for s, ds in SCHEDULE_RUN_EDGES.items() for d in ds}


def test_schedule_run_allowlists_and_reason_codes() -> None:
    p = default_registry().entity("schedule_run")
    assert {"leased_by", "lease_expires_at", "lease_attempts"} <= p.guard_columns
    assert {"leased_by", "lease_expires_at", "lease_attempts", "ended_at", "exit_code",
            "error_detail", "invocation_id", "queued_at"} <= p.patch_columns
    required_codes = {
        "run.queued.submitted", "run.started.ok", "run.completed.ok", "run.failed.exit_nonzero",
        "run.failed.exception", "run.failed.lease_attempts_exhausted", "run.queued.lease_expired",
        "run.cancelled.operator", "run.timed_out.deadline", "run.retry_wait.backoff",
        "run.queued.retry_due", "run.running.lease_renewed", "run.cancelled.dependency_failed",
        "run.queued.dependencies_met",
    }
    assert required_codes <= set(p.reason_codes)
    assert all(p.reason_codes[c] for c in p.reason_codes), "every code has a description"


def test_dispatch_graph_with_operator_only_resurrection() -> None:
    p = with_dispatch().entity("dispatch")
    assert p.table == "dispatch_outbox"
    assert {s: set(t) for s, t in p.edges.items()} == DISPATCH_EDGES
    assert p.terminal == frozenset({"delivered", "acked"})
    assert p.initial == frozenset({"pending"})
    resurrect_patch = frozenset({"attempt", "next_attempt_at", "last_error"})
    for src in ("dead_letter", "expired"):
        rule = p.rule(src, "pending")
        assert rule.actors == frozenset({"operator"})
        assert rule.requires_patch == resurrect_patch
    again = p.rule("delivering", "delivering")
    assert "attempt" in again.requires_guard
    assert again.actors is None
    restricted = {e for e, r in p.edge_rules.items()
                  if r.actors is not None or r.requires_guard or r.requires_patch}
    assert restricted == {("dead_letter", "pending"), ("expired", "pending"),
                          ("delivering", "delivering")}


def test_allows_and_unknown_entity() -> None:
    reg = with_dispatch()
    assert reg.allows("schedule_run", "running", "running")
    assert not reg.allows("schedule_run", "queued", "queued")
    assert not reg.allows("schedule_run", "queued", "completed")
    assert not reg.allows("schedule_run", "completed", "queued")
    assert not reg.allows("schedule_run", "queued", "no_such_state")
    assert reg.allows("dispatch", "dead_letter", "pending")
    assert not reg.allows("dispatch", "delivered", "pending")
    for src, dsts in SCHEDULE_RUN_EDGES.items():
        for dst in SCHEDULE_RUN_EDGES:
            assert reg.allows("schedule_run", src, dst) == (dst in dsts), (src, dst)
    with pytest.raises(ValueError, match="unknown entity"):
        reg.entity("nope")
    with pytest.raises(ValueError, match="unknown entity"):
        reg.allows("nope", "a", "b")


def test_mermaid_contains_every_edge() -> None:
    for name in ("schedule_run", "dispatch"):
        p = with_dispatch().entity(name)
        text = mermaid(p)
        assert text.startswith("stateDiagram-v2")
        lines = [ln.strip() for ln in text.splitlines()]
        arrows = {ln.split(":")[0].strip() for ln in lines if "-->" in ln}
        for src, dsts in p.edges.items():
            for dst in dsts:
                assert f"{src} --> {dst}" in arrows, (name, src, dst)
        for s in p.initial:
            assert f"[*] --> {s}" in arrows
        for s in p.terminal:
            assert f"{s} --> [*]" in arrows
        n_edges = sum(len(d) for d in p.edges.values())
        assert len(arrows) == n_edges + len(p.initial) + len(p.terminal), "no invented edges"
    dispatch = mermaid(with_dispatch().entity("dispatch"))
    assert "dead_letter --> pending: actor operator" in dispatch


def test_outcomes_and_column_groups_of_the_packaged_specs() -> None:
    run = default_registry().entity("schedule_run")
    assert dict(run.outcomes) == {"completed": "succeeded", "failed": "failed",
                                  "timed_out": "failed", "skipped": "skipped",
                                  "cancelled": "cancelled"}
    assert set(run.outcomes) == run.terminal, "every terminal state of a run says how it ended"
    assert run.outcome("completed") == "succeeded"
    assert run.outcome("running") is None and run.outcome("no_such_state") is None
    assert run.states_with_outcome("succeeded") == {"completed"}
    assert run.states_with_outcome("failed", "cancelled") == {"failed", "timed_out", "cancelled"}
    assert run.column_group("lease") == ("leased_by", "lease_expires_at", "lease_token")
    with pytest.raises(ValueError, match="declares no column group 'nope'; known: lease"):
        run.column_group("nope")
    dispatch = with_dispatch().entity("dispatch")
    assert dispatch.states_with_outcome("succeeded") == {"delivered", "acked"}
    with pytest.raises(ValueError, match="known: none"):
        dispatch.column_group("lease")
    with pytest.raises(TypeError):
        run.outcomes["queued"] = "succeeded"  # type: ignore[index]
    with pytest.raises(TypeError):
        run.column_groups["lease"] = ()  # type: ignore[index]


def test_outcomes_and_groups_are_optional_and_every_bad_one_is_named(tmp_path: Path) -> None:
    """The baseline declares neither (an entity the queue does not run needs none); a file
    with several bad ones gets one finding each."""
    f = tmp_path / "widget.toml"
    f.write_text(BASELINE)
    plain = load_registry(f).entity("widget")
    assert dict(plain.outcomes) == {} and dict(plain.column_groups) == {}
    f.write_text(BASELINE.replace(
        '[states.new]\ndescription = "Just made."\n',
        '[states.new]\ndescription = "Just made."\noutcome = "failed"\n').replace(
        '[states.done]\ndescription = "Finished."\n',
        '[states.done]\ndescription = "Finished."\noutcome = "ok"\n')
        + '\n[column_groups]\nempty = []\nboth = ["owner", "owner", "nope"]\n"Bad" = ["note"]\n')
    with pytest.raises(SpecError) as info:
        load_registry(f)
    assert [(p.path, p.message) for p in info.value.problems] == [
        ("$.states.new.outcome", "state 'new' is not terminal; only a terminal state has an "
                                 "outcome"),
        ("$.states.done.outcome", "unknown outcome 'ok'; known: succeeded, failed, cancelled, "
                                  "skipped"),
        ("$.column_groups.empty", "a column group needs at least one column"),
        ("$.column_groups.both[1]", "column 'owner' is listed twice"),
        ("$.column_groups.both[2]", "column 'nope' is not a column of table 'widgets'"),
        ("$.column_groups.'Bad'", "column group names must be lower_snake_case identifiers"),
    ]
    assert all(p.file == str(f) for p in info.value.problems)


# ---------------------------------------------------------------- immutability


def test_policy_is_immutable() -> None:
    p = default_registry().entity("schedule_run")
    with pytest.raises(TypeError):
        p.edges["queued"] = frozenset({"completed"})  # type: ignore[index]
    with pytest.raises(TypeError):
        del p.edges["queued"]  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        p.edges["queued"].add("completed")  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        p.states["zombie"] = "undead"  # type: ignore[index]
    with pytest.raises(TypeError):
        p.reason_codes["run.zombie.bite"] = "x"  # type: ignore[index]
    with pytest.raises(TypeError):
        p.edge_rules[("queued", "completed")] = p.rule("queued", "running")  # type: ignore[index]
    with pytest.raises(AttributeError):
        p.terminal.add("queued")  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        p.guard_columns.add("status")  # type: ignore[attr-defined]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.table = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.edges = {}  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.rule("running", "running").actors = frozenset({"system"})  # type: ignore[misc]
    # Nothing changed.
    assert not p.allows("queued", "completed")
    assert {s: set(t) for s, t in p.edges.items()} == SCHEDULE_RUN_EDGES


def test_registry_is_immutable() -> None:
    reg = default_registry()
    with pytest.raises(AttributeError):
        reg._by_name = {}  # type: ignore[misc]
    with pytest.raises(AttributeError):
        reg.extra = 1  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        reg.entities = []  # type: ignore[misc]
    entities = reg.entities
    entities.append("sneaky")
    assert "sneaky" not in reg.entities, "entities returns a copy"
    assert sorted(reg.entities) == ["schedule", "schedule_run"]


# ---------------------------------------------------------------- refusals


def test_baseline_of_the_broken_fixtures_is_valid(tmp_path: Path) -> None:
    f = tmp_path / "widget.toml"
    f.write_text(BASELINE)
    reg = load_registry(f)
    p = reg.entity("widget")
    assert {s: set(t) for s, t in p.edges.items()} == {"new": {"busy", "done"},
                                                      "busy": {"done"}, "done": set()}
    # Every broken single-file fixture differs from the baseline (it is not a copy).
    for broken in BROKEN.glob("*.toml"):
        assert broken.read_text() != BASELINE, broken


REFUSALS = [
    # (fixture, file the message must name (None: the fixture itself), item, fragment)
    ("edge_to_undeclared_state.toml", None, "$.edges[1].to[1]", "undeclared state 'lost'"),
    ("edge_from_undeclared_state.toml", None, "$.edges[2].from", "undeclared state 'ghost'"),
    ("terminal_with_outgoing_edge.toml", None, "$.edges[2].from",
     "terminal state 'done' has an outgoing edge"),
    ("unreachable_state.toml", None, "$.states.orphan", "unreachable from every initial state"),
    ("no_path_to_terminal.toml", None, "$.states.limbo", "no path to a terminal state"),
    ("required_guard_outside_allowlist.toml", None, "$.edges[1].requires_guard[0]",
     "'note' is not in guard_columns"),
    ("required_patch_outside_allowlist.toml", None, "$.edges[1].requires_patch[0]",
     "'secret' is not in patch_columns"),
    ("guard_column_not_in_table.toml", None, "$.guard_columns[1]",
     "'colour' is not a column of table 'widgets'"),
    ("patch_column_not_in_table.toml", None, "$.patch_columns[2]",
     "'weight' is not a column of table 'widgets'"),
    ("malformed_reason_code.toml", None, "$.reason_codes.'widget.Done'", "malformed reason code"),
    ("duplicate_edge.toml", None, "$.edges[2].to[0]", "declared twice"),
    ("unknown_actor_type.toml", None, "$.edges[1].actors[0]", "unknown actor type 'robot'"),
    ("undeclared_initial_state.toml", None, "$.initial[1]", "undeclared state 'fresh'"),
    ("outcome_on_non_terminal_state.toml", None, "$.states.busy.outcome",
     "only a terminal state has an outcome"),
    ("unknown_outcome.toml", None, "$.states.done.outcome",
     "unknown outcome 'great'; known: succeeded, failed, cancelled, skipped"),
    ("column_group_unknown_column.toml", None, "$.column_groups.claim[1]",
     "'colour' is not a column of table 'widgets'"),
    ("duplicate_entity", "duplicate_entity/b_widget_again.toml", "$.entity",
     "duplicate entity 'widget'"),
    ("duplicate_table", "duplicate_table/b_gadget.toml", "$.table", "duplicate table 'widgets'"),
    # msgspec decoding: the file plus msgspec's own $.path
    ("wrong_type.toml", None, "`$.initial`", "Expected `array`, got `str`"),
    ("unknown_field.toml", None, "`$.edges[1]`", "unknown field `requires_gaurd`"),
]


@pytest.mark.parametrize(("fixture", "named", "item", "fragment"), REFUSALS,
                         ids=[r[0].removesuffix(".toml") for r in REFUSALS])
def test_broken_spec_is_refused_naming_file_and_item(fixture: str, named: str | None, item: str,
                                                     fragment: str) -> None:
    path = BROKEN / fixture
    with pytest.raises(SpecError) as info:
        load_registry(path)
    err = info.value
    assert len(err.problems) == 1, f"fixture should break exactly one rule: {err.problems}"
    problem = err.problems[0]
    named_file = str(BROKEN / (named or fixture))
    # Structured, for a caller that renders them (``ledgerq specs check --json``) ...
    assert problem.file == named_file, problem
    assert problem.path == item.strip("`"), problem
    assert fragment in problem.message, problem
    # ... and one line each in the message, worded as it always was.
    line = str(problem)
    assert line.startswith(named_file + ": "), line
    assert item in line, line
    assert fragment in line, line
    assert line in str(err).splitlines()
    assert isinstance(err, ValueError)


def test_duplicates_name_the_other_file_too() -> None:
    with pytest.raises(SpecError) as info:
        load_registry(BROKEN / "duplicate_entity")
    assert str(BROKEN / "duplicate_entity" / "a_widget.toml") in str(info.value)
    # Each file alone is fine: the refusal is about the set.
    for f in (BROKEN / "duplicate_table").glob("*.toml"):
        load_registry(f)


def test_malformed_toml_names_the_file_and_line() -> None:
    path = BROKEN / "malformed_toml.toml"
    with pytest.raises(SpecError) as info:
        load_registry(path)
    (problem,) = info.value.problems
    assert (problem.file, problem.path) == (str(path), "$")
    assert str(problem).startswith(f"{path}: not valid TOML")
    assert "line 2" in problem.message


def test_missing_spec_dir_or_empty_dir_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such spec file or directory"):
        load_registry(tmp_path / "missing")
    with pytest.raises(SpecError, match="contains no"):
        load_registry(tmp_path)


def test_every_problem_in_a_directory_is_reported(tmp_path: Path) -> None:
    for name in ("edge_to_undeclared_state.toml", "malformed_reason_code.toml"):
        (tmp_path / name).write_text((BROKEN / name).read_text())
    with pytest.raises(SpecError) as info:
        load_registry(tmp_path)
    lines = [str(p) for p in info.value.problems]
    # Each file's own problem, and (both being widgets) the entity and table they share.
    assert len(lines) == 4, lines
    assert any("edge_to_undeclared_state.toml: $.edges[1].to[1]" in p for p in lines)
    assert any("malformed_reason_code.toml: $.reason_codes" in p for p in lines)
    assert any("malformed_reason_code.toml: $.entity: duplicate entity 'widget'" in p
               for p in lines)
    assert any("malformed_reason_code.toml: $.table: duplicate table 'widgets'" in p
               for p in lines)
    assert str(info.value) == "\n".join(lines)


#: Every problem of tests/specs_broken/many_problems, in the order they are reported
#: (file by file; in a file, decoding first, then the registry's rules; then the checks
#: across files): (file, item, fragment of the message).
MANY_PROBLEMS = [
    # The unknown field once stopped the decoding of the whole file right there.
    ("a_gadget.toml", "$.edges[1]", "Object contains unknown field `requires_gaurd`"),
    ("a_gadget.toml", "$.edges[2].actors", "Expected `array | null`, got `str`"),
    ("a_gadget.toml", "$.columns.weight", "Expected `str | object`, got `int`"),
    ("a_gadget.toml", "$.guard_columns[1]", "'colour' is not a column of table 'gadgets'"),
    ("a_gadget.toml", "$.edges[0].to[2]", "edge to undeclared state 'lost'"),
    # The graph checks once ran only on a spec without any other problem.
    ("a_gadget.toml", "$.states.orphan", "unreachable from every initial state"),
    ("a_gadget.toml", "$.reason_codes.'gadget.Done'", "malformed reason code"),
    ("b_sprocket.toml", "$.initial", "Expected `array`, got `str`"),
    ("b_sprocket.toml", "$", "Object missing required field `reason_codes`"),
    ("b_sprocket.toml", "$.columns.size.type", "unknown column type 'decimal'"),
    ("b_sprocket.toml", "$.edges[0].actors[0]", "unknown actor type 'robot'"),
    ("b_sprocket.toml", "$.states.spinning", "no path to a terminal state"),
    ("b_sprocket.toml", "$.indexes[0].columns[0]", "column 'colour' is not in the table"),
    ("c_not_toml.toml", "$", "not valid TOML"),
    # A broken file (a_gadget) once stayed out of the checks across files.
    ("d_gizmo.toml", "$.table", "duplicate table 'gadgets' (also in "),
]


def test_every_problem_of_every_file_is_reported_at_once() -> None:
    root = BROKEN / "many_problems"
    with pytest.raises(SpecError) as info:
        load_registry(root)
    got = [(Path(p.file).name, p.path, p.message) for p in info.value.problems]
    assert [(name, path) for name, path, _ in got] == [
        (name, path) for name, path, _ in MANY_PROBLEMS], got
    for (_, _, message), (_, _, fragment) in zip(got, MANY_PROBLEMS, strict=True):
        assert fragment in message
    # Decoding problems keep msgspec's wording, one line each, as a single-error file
    # always had it.
    lines = str(info.value).splitlines()
    assert f"{root / 'b_sprocket.toml'}: Expected `array`, got `str` - at `$.initial`" in lines
    assert f"{root / 'b_sprocket.toml'}: Object missing required field `reason_codes`" in lines
    assert len(lines) == len(MANY_PROBLEMS)


def test_decode_spec_names_every_bad_item_of_a_file() -> None:
    with pytest.raises(SpecError) as info:
        decode_spec(BROKEN / "many_problems" / "a_gadget.toml")
    assert [p.path for p in info.value.problems] == [
        "$.edges[1]", "$.edges[2].actors", "$.columns.weight"]
    # A valid file decodes to exactly what msgspec makes of the whole document.
    path = REPO / "specs" / "schedule_run.toml"
    assert decode_spec(path) == msgspec.convert(tomllib.loads(path.read_text()),
                                                type=EntitySpec)


def _broken(old: str, new: str) -> str:
    assert old in BASELINE
    return BASELINE.replace(old, new)


#: A problem each, which a check depending on the broken item would echo in other words
#: if it ran on what is left: (spec text, the one item reported).
NO_ECHOES = [
    # The state's declaration is refused, yet it is declared: its edges are not "to an
    # undeclared state", nor is it unreachable.
    (_broken('description = "Being worked on."', "description = 1"), "$.states.busy.description"),
    # The allowlist did not decode: requires_guard = ["owner"] is not "outside" it.
    (_broken('guard_columns = ["owner"]', 'guard_columns = "owner"'), "$.guard_columns"),
    # The column's declaration is refused: the allowlists still name a column it has.
    (_broken('owner = "text"', 'owner = "decimal"'), "$.columns.owner"),
    (_broken('owner = "text"', "owner = 7"), "$.columns.owner"),
    # No initial list: every state is not therefore unreachable.
    (_broken('initial = ["new"]', 'initial = "new"'), "$.initial"),
    # An edge that did not decode leaves the graph unknown: busy may well finish.
    (_broken('to = ["done"]\nrequires_guard', 'to = "done"\nrequires_guard'), "$.edges[1].to"),
    # busy's one way out names an undeclared state: whether busy finishes is unknown.
    (_broken('to = ["done"]\nrequires_guard', 'to = ["dnoe"]\nrequires_guard'),
     "$.edges[1].to[0]"),
    # An edge from an undeclared state may have been busy's way in.
    (_broken('to = ["busy", "done"]', 'to = ["done"]') + '[[edges]]\nfrom = "nwe"\nto = ["busy"]\n',
     "$.edges[2].from"),
    (_broken('table = "widgets"', "table = 5"), "$.table"),
]


@pytest.mark.parametrize(("text", "item"), NO_ECHOES, ids=[n[1] for n in NO_ECHOES])
def test_a_problem_is_reported_once_not_echoed(tmp_path: Path, text: str, item: str) -> None:
    f = tmp_path / "widget.toml"
    f.write_text(text)
    with pytest.raises(SpecError) as info:
        load_registry(f)
    assert [p.path for p in info.value.problems] == [item], info.value.problems


# ---------------------------------------------------------------- schema from spec


async def test_status_check_in_the_real_tables(db_path: Path) -> None:
    reg = with_dispatch()
    async with StateDB(db_path, registry=reg) as db:
        for policy in reg.policies():
            ddl = await db.fetch_one(
                "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?",
                (policy.table,))
            assert ddl is not None
            assert policy.status_check() in ddl["sql"]
    conn = sqlite3.connect(db_path)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        insert_run = ("INSERT INTO schedule_runs (id, status, created_at, trigger_context, "
                      "action_kind, action_args, fired_at) VALUES (?, ?, 0, '{}', 'k', '[]', 0)")
        for state in reg.entity("schedule_run").states:
            conn.execute(insert_run, (f"ok-{state}", state))
        for bad in ("bogus", "QUEUED", "", "pending"):
            with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
                conn.execute(insert_run, (f"bad-{bad}", bad))
        insert_dispatch = ("INSERT INTO dispatch_outbox (id, status, created_at, channel, payload)"
                           " VALUES (?, ?, 0, 'c', '{}')")
        conn.execute(insert_dispatch, ("d-ok", "dead_letter"))
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            conn.execute(insert_dispatch, ("d-bad", "queued"))
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            conn.execute("UPDATE schedule_runs SET status = 'zombie' WHERE id = 'ok-queued'")
    finally:
        conn.close()


async def test_status_check_follows_a_custom_spec(tmp_path: Path) -> None:
    spec = tmp_path / "specs" / "widget.toml"
    spec.parent.mkdir()
    spec.write_text(BASELINE)
    reg = load_registry(spec.parent, packaged=False)  # the directory's specs alone
    async with StateDB(tmp_path / "w.db", registry=reg) as db:
        tables = {r["name"] for r in await db.fetch_all(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "widgets" in tables
        assert "schedule_runs" not in tables and "dispatch_outbox" not in tables
    conn = sqlite3.connect(tmp_path / "w.db")
    try:
        conn.execute("INSERT INTO widgets (id, status, created_at) VALUES ('a', 'busy', 0)")
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("INSERT INTO widgets (id, status, created_at) VALUES ('b', 'queued', 0)")
    finally:
        conn.close()


# ---------------------------------------------------------------- descending index keys


def test_descending_index_keys_are_checked_and_rendered(tmp_path: Path) -> None:
    from ledgerq.store.ddl import index_statements

    def with_index(descending: str) -> Path:
        f = tmp_path / "widget.toml"
        f.write_text(BASELINE + '\n[[indexes]]\nname = "idx_widgets_owner"\n'
                     f'columns = ["owner", "id"]\ndescending = {descending}\n')
        return f

    policy = load_registry(with_index('["owner"]')).entity("widget")
    (ix,) = policy.indexes
    assert ix.descending == frozenset({"owner"})
    assert '("owner" DESC, "id")' in index_statements(policy)["idx_widgets_owner"]
    for bad, message in (('["colour"]', "column 'colour' is not one of the index's columns"),
                         ('["owner", "owner"]', "column 'owner' is listed twice")):
        with pytest.raises(SpecError) as info:
            load_registry(with_index(bad))
        assert [(p.path.split("[")[0], message in p.message) for p in info.value.problems] == [
            ("$.indexes", True)], info.value.problems


def test_an_index_without_descending_keys_normalizes_as_before() -> None:
    """Recorded specs from before the field compare equal: opening adds no index change."""
    from ledgerq.lifecycle.evolution import policy_normal

    normal = policy_normal(default_registry().entity("schedule_run"))
    by_name = {ix["name"]: ix for ix in normal["indexes"]}
    assert "descending" not in by_name["idx_schedule_runs_lease"]
    assert by_name["idx_schedule_runs_claim_order"]["descending"] == ["priority"]


def test_a_spec_directory_adds_to_the_packaged_specs(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """A directory holding only its own entity keeps the queue's; a file for a packaged
    entity replaces the packaged one, and says so."""
    import logging

    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "widget.toml").write_text(BASELINE)
    merged = load_registry(specs)
    assert {"widget", "schedule_run", "schedule"} <= set(merged.entities)
    packaged_run = (packaged_specs_dir() / "schedule_run.toml").read_text()
    (specs / "runs.toml").write_text(packaged_run.replace(
        'description = "One execution of an action', 'description = "Replaced: one execution'))
    with caplog.at_level(logging.INFO, logger="ledgerq.specs"):
        replaced = load_registry(specs)
    assert replaced.entity("schedule_run").description.startswith("Replaced")
    assert any("replaces the packaged spec of schedule_run" in r.getMessage()
               for r in caplog.records)
    assert set(load_registry(specs, packaged=False).entities) == {"widget", "schedule_run"}
