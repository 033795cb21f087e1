"""A JSON body made into a TaskApplication, with the library's rules and messages.

The body is turned into the dataclass field by field and handed to ``submit_task``,
which validates it exactly as it validates a Python caller's application; this module
only refuses what cannot become a TaskApplication at all (not an object, an unknown or
missing field, a retry policy that is not an object), in the same one-line style.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ledgerq.errors import InvalidInput
from ledgerq.queue.submission.application import RetryPolicy, TaskApplication, shown

FIELDS = {f.name: f for f in dataclasses.fields(TaskApplication)}
REQUIRED = [name for name, f in FIELDS.items()
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
RETRY_FIELDS = [f.name for f in dataclasses.fields(RetryPolicy)]


def application_from_json(body: Any, header_key: str | None) -> TaskApplication:
    """The TaskApplication a request asks for; InvalidInput names what is wrong."""
    if not isinstance(body, dict):
        raise InvalidInput(f"the body must be a JSON object (a TaskApplication), "
                           f"got {type(body).__name__}")
    unknown = [k for k in body if k not in FIELDS]
    if unknown:
        raise InvalidInput(f"unknown field {shown(unknown[0])}; a TaskApplication has "
                           + ", ".join(FIELDS))
    missing = [name for name in REQUIRED if name not in body]
    if missing:
        raise InvalidInput(f"missing field {missing[0]!r} (required: {', '.join(REQUIRED)})")
    fields = dict(body)
    if header_key is not None:
        if fields.get("idempotency_key") not in (None, header_key):
            raise InvalidInput("the Idempotency-Key header and the body's idempotency_key "
                               "differ; send one, or the same in both")
        fields["idempotency_key"] = header_key
    retry = fields.get("retry")
    if retry is not None:
        if not isinstance(retry, dict):
            raise InvalidInput(f"retry must be an object ({', '.join(RETRY_FIELDS)}) or null, "
                               f"got {type(retry).__name__}")
        extra = [k for k in retry if k not in RETRY_FIELDS]
        if extra:
            raise InvalidInput(f"unknown retry field {shown(extra[0])}; a retry policy has "
                               + ", ".join(RETRY_FIELDS))
        if "max_attempts" not in retry or "base_delay" not in retry:
            raise InvalidInput("retry needs max_attempts and base_delay")
        fields["retry"] = RetryPolicy(**retry)
    return TaskApplication(**fields)
