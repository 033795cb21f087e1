"""What a move or a creation may write, checked before anything is: the reason code, the
columns the spec allows, and values both the row and the log store exactly.

The log holds every value as JSON and the row as its column stores it; a value only one
of them represents exactly (a bytes value, a NaN, an int past 64 bits) would make the
row and the fold of its facts differ, and ``verify()`` report drift.
"""

from __future__ import annotations

import math
from typing import Any

from ledgerq.codec import CONTAINERS
from ledgerq.errors import InvalidInput, UnknownReason
from ledgerq.lifecycle.models import StateReason
from ledgerq.lifecycle.policy_cache import CACHES, PolicyCache, cache_of
from ledgerq.lifecycle.registry import EntityPolicy


def check_columns(policy: EntityPolicy, guard: dict[str, Any] | None,
                  patch: dict[str, Any] | None) -> None:
    """Allowlisted columns, and values the log can store exactly (ValueError otherwise)."""
    check_allowed(policy, guard, patch)
    if guard:
        check_values(policy, "guard", guard)
    if patch:
        check_values(policy, "patch", patch)


def check_allowed(policy: EntityPolicy, guard: dict[str, Any] | None,
                  patch: dict[str, Any] | None) -> None:
    """The guard and patch columns are in the spec's allowlists (InvalidInput otherwise)."""
    for kind, given, allowed in (("guard", guard, policy.guard_columns),
                                 ("patch", patch, policy.patch_columns)):
        if given and not allowed.issuperset(given):
            names = [k for k in given if not isinstance(k, str)]
            if names:
                raise InvalidInput(f"{kind} column names must be strings, not {names[0]!r}")
            extra = sorted(set(given) - allowed)
            raise InvalidInput(
                f"{kind} column(s) {', '.join(extra)} not allowed for {policy.name}; "
                f"allowed: {', '.join(sorted(allowed)) or 'none'}"
            )


#: The Python types each logical column type takes (bool is no integer here, whatever
#: Python says): SQLite would coerce a mismatch by column affinity and PostgreSQL refuse
#: it, so the engine refuses it first, the same on both.
_LOGICAL = {"text": (str,), "integer": (int,), "float": (int, float),
            "timestamp": (int, float), "boolean": (bool,)}
#: Logical types whose database default reads back as the JSON value PostgreSQL's
#: ``to_jsonb`` gives it (a float default would read back as ``0.0``, to_jsonb says ``0``).
DEFAULT_AS_JSON = frozenset({"text", "integer", "boolean", "json"})


def check_values(policy: EntityPolicy, kind: str, given: dict[str, Any], *,
                 json_text: bool = False) -> list[str]:
    """Each value fits its column's logical type and can be stored exactly in the log;
    returns the columns whose values are lists or objects (JSON to encode), usually none.

    ``json_text``: a str given for a JSON column is JSON text (a creation's rows), not a
    JSON string value. Runs for every value of every move and creation, so the common
    case (None, or a scalar of its column's exact type) costs a test or two.
    """
    plain = _plain_types(policy, json_text)
    containers: list[str] = []
    for col, value in given.items():
        # The common values first, each with the one test its type needs. (A creation's
        # values get these same tests in creation._sent_patch's loop first: change both.)
        if value is None:
            continue
        vtype = type(value)
        if vtype is str:
            if value.isascii() and "\x00" not in value and str in plain[col]:
                continue
        elif vtype is float:
            if _isfinite(value) and float in plain[col] and -JSON_FLOAT_LIMIT < value \
                    < JSON_FLOAT_LIMIT:
                continue
        elif vtype is int and INT64_MIN <= value <= INT64_MAX and int in plain[col]:
            continue
        logical = policy.columns[col].type
        allowed = _LOGICAL.get(logical)
        if allowed is not None and (vtype not in allowed and not (
                vtype is not bool and isinstance(value, allowed))):
            hint = (" (lists and objects go only into JSON columns)"
                    if isinstance(value, list | tuple | dict) else "")
            raise InvalidInput(f"{kind} column {col} of {policy.name} is {logical}; "
                               f"got {vtype.__name__} {value!r:.60}{hint}")
        if vtype is bool:
            continue
        problem = value_problem(value, json=logical == "json")
        if problem is not None:
            raise InvalidInput(f"{kind} column {col} of {policy.name}: {problem}")
        if isinstance(value, CONTAINERS):
            containers.append(col)
    return containers


def _plain_types(policy: EntityPolicy, json_text: bool) -> dict[str, frozenset[type]]:
    """Per column, the exact types whose values need no further look (None included),
    worked out once per policy (see :mod:`~ledgerq.lifecycle.policy_cache`)."""
    cache: PolicyCache = CACHES.get(id(policy)) or cache_of(policy)
    found = cache.plain_types.get(json_text)
    if found is not None:
        return found
    found = {}
    for col, column in policy.columns.items():
        types: set[type] = {type(None), *_LOGICAL.get(column.type, ())}
        if column.type == "json" and json_text:
            types.add(str)
        found[col] = frozenset(types)
    cache.plain_types[json_text] = found
    return found


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Floats in JSON values stay below this in size: past it every float is an integer, and
#: a decimal store (PostgreSQL's jsonb) reads it back as an integer literal.
JSON_FLOAT_LIMIT = float(2**53)
_isfinite = math.isfinite
#: Nesting a JSON column value may have; deeper values are refused, never a RecursionError.
MAX_JSON_DEPTH = 64


def value_problem(value: Any, *, json: bool) -> str | None:
    """Why ``value`` cannot be stored in a row and its fact so that both read back equal.

    The row holds it as SQLite stores it and the fact holds it as JSON: only values both
    represent exactly qualify (None, bool, 64-bit int, finite float, UTF-8 str, and for
    JSON columns lists and string-keyed dicts of those). A bytes value, for instance,
    would be a BLOB in the row and base64 in the fact, and verify() would see drift.
    """
    todo: list[tuple[Any, int]] = [(value, 0)]
    while todo:
        item, depth = todo.pop()
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, int):
            if not INT64_MIN <= item <= INT64_MAX:
                return f"integer {item} does not fit in 64 bits"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"{item!r} is not a finite number"
            if json and not -JSON_FLOAT_LIMIT < item < JSON_FLOAT_LIMIT:
                # PostgreSQL's jsonb keeps a number as a decimal, printed without an
                # exponent: 2.5e16 reads back as the integer 25000000000000000, and a
                # float past 2**53 as an integer other than its exact value.
                return (f"the float {item!r} in a JSON value is 2**53 or more in size, "
                        "which JSON does not carry exactly (store it as a string)")
        elif isinstance(item, str):
            if "\x00" in item:
                # PostgreSQL text cannot hold NUL; refused on both backends alike.
                return "text contains a NUL character"
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return "text is not valid UTF-8 (a lone surrogate)"
        elif isinstance(item, list | tuple | dict) and json:
            if depth >= MAX_JSON_DEPTH:
                return f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
            if isinstance(item, dict):
                for key in item:
                    if not isinstance(key, str):
                        return f"JSON object keys must be strings, not {key!r:.60}"
                    todo.append((key, depth + 1))
                todo.extend((v, depth + 1) for v in item.values())
            else:
                todo.extend((v, depth + 1) for v in item)
        else:
            kind = type(item).__name__
            where = "" if json else " (lists and objects go only into JSON columns)"
            return f"a {kind} value cannot be stored exactly in the log{where}"
    return None


def check_reason(policy: EntityPolicy, reason: StateReason) -> None:
    if reason.code not in policy.reason_codes:
        raise UnknownReason(
            f"unknown reason code {reason.code!r} for {policy.name}; "
            f"declared: {', '.join(sorted(policy.reason_codes))}"
        )
