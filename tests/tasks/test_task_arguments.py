"""A task function's arguments and result as the queue stores them: checked against the
signature when deferred (a bad argument is refused naming the parameter), stored as JSON
(through real JSON text, as a row holds it), and given back as the annotated types."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import uuid
from decimal import Decimal
from typing import Any

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledgerq.errors import InvalidInput
from ledgerq.tasks import TaskArguments, TaskResult


class Size(enum.Enum):
    SMALL = "s"
    LARGE = "l"


@dataclasses.dataclass
class Crop:
    left: int
    top: int


class Owner(pydantic.BaseModel):
    name: str
    since: dt.date


def resize(path: str, width: int, *, when: dt.datetime | None = None,
           size: Size = Size.SMALL, crop: Crop | None = None, owner: Owner | None = None,
           budget: Decimal = Decimal("0"), request: uuid.UUID | None = None) -> list[int]:
    return [width]


def through_json(value: Any) -> Any:
    """What a row gives back: the JSON text parsed again."""
    return json.loads(json.dumps(value))


ARGS = TaskArguments(resize, "images.resize")


def test_every_supported_type_comes_back_as_its_annotation() -> None:
    when = dt.datetime(2026, 12, 6, 20, 30, tzinfo=dt.UTC)
    call = {"path": "a.png", "width": 100, "when": when, "size": Size.LARGE,
            "crop": Crop(1, 2), "owner": Owner(name="ann", since=dt.date(2020, 1, 2)),
            "budget": Decimal("12.50"), "request": uuid.UUID(int=7)}
    stored = through_json(ARGS.encode((), call))
    assert ARGS.decode(stored) == call
    assert isinstance(ARGS.decode(stored)["crop"], Crop)


def test_positional_arguments_are_stored_by_name() -> None:
    assert ARGS.encode(("a.png", 5))["width"] == 5
    assert ARGS.decode(through_json(ARGS.encode(("a.png", 5))))["path"] == "a.png"


@pytest.mark.parametrize(("call", "named"), [
    ({"path": "a.png", "width": "100"}, "'width'"),  # a string is not coerced to an int
    ({"path": "a.png"}, "width"),  # missing
    ({"path": "a.png", "width": 1, "colour": "red"}, "colour"),  # unknown
    ({"path": "a.png", "width": 1, "size": "huge"}, "'size'"),
    ({"path": "a.png", "width": 1, "when": "yesterday"}, "'when'"),
    ({"path": 3, "width": 1}, "'path'"),
])
def test_a_bad_argument_is_refused_naming_the_parameter(call: dict[str, Any],
                                                        named: str) -> None:
    with pytest.raises(InvalidInput, match=named) as refused:
        ARGS.encode((), call)
    assert str(refused.value).startswith("task images.resize:")


def test_stored_arguments_that_no_longer_fit_are_refused() -> None:
    with pytest.raises(InvalidInput, match="stored argument 'width'"):
        ARGS.decode({"path": "a.png", "width": "not a number"})


def test_parameters_that_cannot_be_named_are_refused_when_declared() -> None:
    def positional_only(a: int, /) -> None: ...

    def varargs(*items: int) -> None: ...

    for fn in (positional_only, varargs):
        with pytest.raises(InvalidInput, match="passable by name"):
            TaskArguments(fn, "t")


def test_keyword_catch_alls_keep_their_extra_arguments() -> None:
    def notify(channel: str, **fields: Any) -> None: ...

    args = TaskArguments(notify, "notify")
    stored = through_json(args.encode((), {"channel": "ops", "level": 3, "who": ["a"]}))
    assert args.decode(stored) == {"channel": "ops", "level": 3, "who": ["a"]}


def test_the_parameters_have_a_json_schema() -> None:
    schema = ARGS.json_schema()
    assert schema["required"] == ["path", "width"]
    assert schema["properties"]["width"]["type"] == "integer"
    assert schema["additionalProperties"] is False


def test_results_come_back_as_the_return_annotation() -> None:
    result = TaskResult(resize, "images.resize")
    assert result.decode(through_json(result.encode([1, 2]))) == [1, 2]
    with pytest.raises(InvalidInput, match="declared return type"):
        result.encode("not a list")

    def when() -> dt.datetime:
        return dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

    typed = TaskResult(when, "when")
    assert typed.decode(through_json(typed.encode(when()))) == when()

    def nothing() -> None: ...

    assert TaskResult(nothing, "nothing").encode(None) is None


json_safe_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@given(path=json_safe_text, width=st.integers(-(2**63), 2**63 - 1),
       when=st.none() | st.datetimes(timezones=st.just(dt.UTC)),
       budget=st.decimals(allow_nan=False, allow_infinity=False, places=4,
                          min_value=-(10**12), max_value=10**12),
       request=st.none() | st.uuids(), size=st.sampled_from(Size))
def test_any_arguments_round_trip_through_json(path: str, width: int, when: dt.datetime | None,
                                               budget: Decimal, request: uuid.UUID | None,
                                               size: Size) -> None:
    call = {"path": path, "width": width, "when": when, "budget": budget,
            "request": request, "size": size}
    back = ARGS.decode(through_json(ARGS.encode((), call)))
    assert {k: back[k] for k in call} == call
