"""The submission boundary's limits and text checks.

Every refusal here must be an InvalidInput (so a ValueError) whose message names the
field, raised before any transaction: the database holds exactly what it held before.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ledgerq import StateDB
from ledgerq.codec import dumps
from ledgerq.errors import InvalidInput
from ledgerq.queue import SubmitLimits as PublicSubmitLimits
from ledgerq.queue import TaskApplication, submit_many, submit_task
from ledgerq.queue.submission.application import (
    ARGS_DEPTH_CEILING,
    MAX_ARGS_BYTES,
    MAX_ARGS_DEPTH,
    MAX_CAPABILITIES,
    MAX_CAPABILITY_LENGTH,
    MAX_DEPENDS_ON,
    MAX_IDEMPOTENCY_KEY_LENGTH,
    SubmitLimits,
    validate,
)


@pytest.fixture
async def qdb(db_target: str) -> AsyncIterator[StateDB]:
    async with StateDB(db_target) as handle:
        yield handle


def app(**kw: Any) -> TaskApplication:
    fields: dict[str, Any] = {"action_kind": "agent", "args": {"prompt": "hi"},
                              "execution_target": "host"}
    fields.update(kw)
    return TaskApplication(**fields)


def command(argv: list[Any], **args: Any) -> TaskApplication:
    return app(action_kind="command", args={"argv": argv, **args})


async def counts(db: StateDB) -> tuple[int, int]:
    got = await db.fetch_one(
        "SELECT (SELECT count(*) FROM schedule_runs) AS runs, "
        "(SELECT count(*) FROM status_transitions) AS facts")
    assert got is not None
    return int(got["runs"]), int(got["facts"])


async def refused(db: StateDB, application: TaskApplication, *needles: str,
                  limits: SubmitLimits | None = None) -> str:
    """Submit, expect InvalidInput (a ValueError) with every needle, and nothing written."""
    before = await counts(db)
    with pytest.raises(InvalidInput) as info:
        await submit_task(db, application, limits=limits)
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    for needle in needles:
        assert needle in message, message
    assert await counts(db) == before
    return message


def nested_dicts(levels: int) -> dict[str, Any]:
    """``levels`` dicts, each inside the previous one (``{}`` alone is one level)."""
    root: dict[str, Any] = {}
    node = root
    for _ in range(levels - 1):
        child: dict[str, Any] = {}
        node["a"] = child
        node = child
    return root


def nested_lists(levels: int) -> dict[str, Any]:
    """``args`` (one level) holding ``levels - 1`` nested lists."""
    inner: list[Any] = []
    for _ in range(levels - 2):
        inner = [inner]
    return {"x": inner}


# ----------------------------------------------------------------- depth


@pytest.mark.parametrize("make", [nested_dicts, nested_lists], ids=["dicts", "lists"])
async def test_five_thousand_levels_are_refused_not_a_recursion_error(
        qdb: StateDB, make: Any) -> None:
    message = await refused(qdb, app(args=make(5000)), "nested too deeply",
                            f"limit is {MAX_ARGS_DEPTH}", "max_args_depth")
    assert len(message) < 400, message  # the path is shortened, not 5,000 steps long


@pytest.mark.parametrize("make", [nested_dicts, nested_lists], ids=["dicts", "lists"])
async def test_depth_limit_is_exact(qdb: StateDB, make: Any) -> None:
    await submit_task(qdb, app(args=make(MAX_ARGS_DEPTH)))
    await refused(qdb, app(args=make(MAX_ARGS_DEPTH + 1)),
                  f"is level {MAX_ARGS_DEPTH + 1}")


async def test_depth_limit_is_configurable(qdb: StateDB) -> None:
    shallow = SubmitLimits(max_args_depth=3)
    await submit_task(qdb, app(args={"a": {"b": {"c": 1}}}), limits=shallow)
    await refused(qdb, app(args={"a": {"b": {"c": {}}}}), "args['a']['b']['c'] is level 4",
                  limits=shallow)
    deep = SubmitLimits(max_args_depth=ARGS_DEPTH_CEILING)
    await submit_task(qdb, app(args=nested_dicts(ARGS_DEPTH_CEILING)), limits=deep)


# ----------------------------------------------------------------- size


def args_of_size(size: int) -> dict[str, Any]:
    """args whose JSON text is exactly ``size`` bytes of UTF-8 (``{"p":"..."}``)."""
    overhead = len(dumps({"p": ""}))
    args = {"p": "x" * (size - overhead)}
    assert len(dumps(args).encode()) == size
    return args


async def test_args_size_default_is_one_mebibyte(qdb: StateDB) -> None:
    assert MAX_ARGS_BYTES == 1024 * 1024
    await submit_task(qdb, app(args=args_of_size(MAX_ARGS_BYTES)))
    message = await refused(qdb, app(args=args_of_size(MAX_ARGS_BYTES + 1)),
                            f"{MAX_ARGS_BYTES + 1:,} bytes", "max_args_bytes")
    assert len(message) < 200


async def test_args_size_counts_utf8_bytes_not_characters(qdb: StateDB) -> None:
    small = SubmitLimits(max_args_bytes=100)
    # 40 "é" are 40 characters but 80 bytes; with {"p":""} (8 bytes) that is 88: fits.
    await submit_task(qdb, app(args={"p": "é" * 40}), limits=small)
    # 47 of them: 47 characters, 102 bytes: over.
    await refused(qdb, app(args={"p": "é" * 47}), "102 bytes", limits=small)


async def test_args_size_limit_is_configurable(qdb: StateDB) -> None:
    big = SubmitLimits(max_args_bytes=2 * MAX_ARGS_BYTES)
    await submit_task(qdb, app(args=args_of_size(MAX_ARGS_BYTES + 1)), limits=big)
    await submit_many(qdb, [app(args=args_of_size(2 * MAX_ARGS_BYTES))], limits=big)


# ----------------------------------------------------------------- keys, ids


async def test_idempotency_key_length(qdb: StateDB) -> None:
    await submit_task(qdb, app(idempotency_key="k" * MAX_IDEMPOTENCY_KEY_LENGTH))
    message = await refused(qdb, app(idempotency_key="k" * 100_000),
                            "idempotency_key", "100,000 characters",
                            f"limit is {MAX_IDEMPOTENCY_KEY_LENGTH}")
    assert len(message) < 200
    await refused(qdb, app(idempotency_key="k" * 11), "idempotency_key",
                  limits=SubmitLimits(max_idempotency_key_length=10))


async def test_depends_on_count_is_limited_before_any_lookup(qdb: StateDB) -> None:
    dep = await submit_task(qdb, app())
    await submit_task(qdb, app(depends_on=[dep] * MAX_DEPENDS_ON))
    message = await refused(qdb, app(depends_on=[dep] * 100_000), "depends_on",
                            "100,000 run ids", f"limit is {MAX_DEPENDS_ON:,}")
    assert len(message) < 200


async def test_required_capabilities_are_bounded(qdb: StateDB) -> None:
    """Every idle worker's claim pass reads a queued run's capabilities: 60 runs with
    100,000 each made an idle worker burn most of a core."""
    await submit_task(qdb, app(required_capabilities=[f"c{i}" for i in range(MAX_CAPABILITIES)]))
    message = await refused(qdb, app(required_capabilities=[f"c{i}" for i in range(100_000)]),
                            "required_capabilities", "100,000 tokens",
                            f"limit is {MAX_CAPABILITIES}")
    assert len(message) < 200
    await refused(qdb, app(required_capabilities=["x" * (MAX_CAPABILITY_LENGTH + 1)]),
                  "required_capabilities[0]", f"limit is {MAX_CAPABILITY_LENGTH}")
    await refused(qdb, app(required_capabilities=["a", "b"]), "required_capabilities",
                  limits=SubmitLimits(max_capabilities=1))


async def test_unknown_depends_on_message_lists_a_few_and_counts_the_rest(
        qdb: StateDB) -> None:
    ids = [f"missing-{i:06d}" for i in range(100_000)]
    message = await refused(qdb, app(depends_on=ids), "100,000 unknown run id(s)",
                            "missing-000000", "missing-000009", "and 99,990 more",
                            limits=SubmitLimits(max_depends_on=100_000))
    assert "missing-000010" not in message
    assert len(message) < 400, len(message)


async def test_unknown_depends_on_message_quotes_unprintable_ids(qdb: StateDB) -> None:
    message = await refused(qdb, app(depends_on=["\x1b[2Jgone"]), "unknown run id")
    assert "\x1b" not in message and "\\x1b[2Jgone" in message


# ----------------------------------------------------------------- argv and cwd


@pytest.mark.parametrize(("argv", "needle"), [
    (["echo", 3], "args['argv'][1] must be a string, got int"),
    (["echo", None], "args['argv'][1] must be a string, got NoneType"),
    (["echo", ["x"]], "args['argv'][1] must be a string, got list"),
    (["echo", "a\0b"], "args['argv'][1] contains a NUL character"),
    (["ec\0ho"], "args['argv'][0] contains a NUL character"),
    ([""], "args['argv'][0] (the program) must not be empty"),
    ([], 'args["argv"]'),
])
async def test_argv_entries_exec_cannot_take_are_refused(
        qdb: StateDB, argv: list[Any], needle: str) -> None:
    await refused(qdb, command(argv), needle)


@pytest.mark.parametrize(("cwd", "needle"), [
    (3, "args['cwd'] (the working directory) must be a non-empty string, got int"),
    (["/tmp"], "must be a non-empty string, got list"),
    (None, "must be a non-empty string, got NoneType"),
    ("", "must be a non-empty string"),
    ("/tmp\0/x", "args['cwd'] contains a NUL character"),
])
async def test_cwd_must_be_a_string_exec_can_take(qdb: StateDB, cwd: Any, needle: str) -> None:
    await refused(qdb, command(["true"], cwd=cwd), needle)


async def test_cwd_of_other_kinds_is_plain_data(qdb: StateDB) -> None:
    await submit_task(qdb, app(args={"cwd": 3}))  # only command tasks chdir


# ----------------------------------------------------------------- text that is not UTF-8


# What Python makes of the byte 0xff in argv, the environment or a file name.
UNDECODABLE = b"x\xff".decode("utf-8", "surrogateescape")


@pytest.mark.parametrize(("application", "field"), [
    (command(["echo", UNDECODABLE]), "args['argv'][1]"),
    (app(args={"k": UNDECODABLE}), "args['k']"),
    (app(args={"k": [{"deep": UNDECODABLE}]}), "args['k'][0]['deep']"),
    (app(args={UNDECODABLE: 1}), "a key of args ('x\\udcff')"),
    (command(["true"], cwd=UNDECODABLE), "args['cwd']"),
    (app(idempotency_key=UNDECODABLE), "idempotency_key"),
    (app(required_capabilities=["gpu", UNDECODABLE]), "required_capabilities[1]"),
    (app(library_ref=UNDECODABLE), "library_ref"),
    (app(library_content_hash=UNDECODABLE), "library_content_hash"),
    (app(depends_on=[UNDECODABLE]), "depends_on[0]"),
], ids=["argv", "arg", "nested", "key", "cwd", "idempotency_key", "capability", "library_ref",
        "library_hash", "depends_on"])
async def test_undecodable_bytes_name_the_field(
        qdb: StateDB, application: TaskApplication, field: str) -> None:
    await refused(qdb, application, f"{field} is not valid UTF-8 text",
                  "byte 0xff at position 1")


async def test_a_lone_surrogate_from_a_json_escape_is_refused(qdb: StateDB) -> None:
    # json.loads('"\\ud800"') yields this: valid JSON text, but no UTF-8 can store it.
    await refused(qdb, app(args={"k": "a\ud800"}), "args['k']", "lone surrogate U+D800")


# ----------------------------------------------------------------- plain JSON, named


@pytest.mark.parametrize(("args", "needle"), [
    ({"k": float("nan")}, "args['k'] is nan"),
    ({"k": [1, float("inf")]}, "args['k'][1] is inf"),
    ({"k": {1, 2}}, "args['k'] is a set"),
    ({"k": (1, 2)}, "args['k'] is a tuple"),
    ({"k": b"x"}, "args['k'] is a bytes"),
    ({"k": {1: "x"}}, "args['k'] has a key that is not a string: 1 (int)"),
])
async def test_values_json_cannot_store_exactly_are_named(
        qdb: StateDB, args: dict[str, Any], needle: str) -> None:
    await refused(qdb, app(args=args), needle)


async def test_a_huge_bad_value_is_quoted_short(qdb: StateDB) -> None:
    message = await refused(qdb, app(action_kind="x" * 1_000_000), "unknown action_kind",
                            "1,000,002 characters")
    assert len(message) < 400


# ----------------------------------------------------------------- the batch and the limits


async def test_submit_many_names_the_refused_application_and_writes_none(
        qdb: StateDB) -> None:
    before = await counts(qdb)
    with pytest.raises(InvalidInput, match=r"^apps\[1\]: args\['argv'\]\[0\] contains a NUL"):
        await submit_many(qdb, [command(["true"]), command(["a\0"]), command(["true"])])
    assert await counts(qdb) == before


@pytest.mark.parametrize("fields", [
    {"max_args_depth": 0}, {"max_args_bytes": -1}, {"max_idempotency_key_length": 1.5},
    {"max_depends_on": True}, {"max_args_depth": ARGS_DEPTH_CEILING + 1},
])
def test_bad_limits_are_refused(fields: dict[str, Any]) -> None:
    name = next(iter(fields))
    with pytest.raises(InvalidInput, match=f"SubmitLimits.{name}"):
        SubmitLimits(**fields)


def test_validate_takes_only_a_limits_object() -> None:
    with pytest.raises(TypeError, match="SubmitLimits"):
        validate(app(), limits={"max_args_depth": 3})  # type: ignore[arg-type]


def test_limits_are_exported_with_the_queue_api() -> None:
    assert PublicSubmitLimits is SubmitLimits


def test_docs_state_the_limits_the_code_has() -> None:
    """docs/queue.md's Limits table names each constant with its current default."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "queue.md").read_text("utf-8")
    defaults = SubmitLimits()
    for field_name, constant, value in (
            ("max_args_depth", "MAX_ARGS_DEPTH", MAX_ARGS_DEPTH),
            ("max_args_bytes", "MAX_ARGS_BYTES", MAX_ARGS_BYTES),
            ("max_idempotency_key_length", "MAX_IDEMPOTENCY_KEY_LENGTH",
             MAX_IDEMPOTENCY_KEY_LENGTH),
            ("max_depends_on", "MAX_DEPENDS_ON", MAX_DEPENDS_ON),
            ("max_capabilities", "MAX_CAPABILITIES", MAX_CAPABILITIES)):
        assert getattr(defaults, field_name) == value
        assert f"| `{field_name}` (`{constant}`) | {value:,}" in text, field_name
    assert f"`ARGS_DEPTH_CEILING` = {ARGS_DEPTH_CEILING}" in text
