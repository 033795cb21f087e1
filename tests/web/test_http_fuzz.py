"""Property-based fuzzing of the API from its own OpenAPI document (schemathesis).

Cases are generated from the served /openapi.json and sent to a real server process:
no answer may be a 5xx, and every answer must match the document (status code declared,
content type, body schema). A bounded number of examples per operation keeps this to
seconds; write operations run with the token, so submissions really happen.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from helpers.server import TOKEN, Server, serve

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serve(str(Path(tmp_path_factory.mktemp("fuzz")) / "fuzz.db")) as s:
        yield s


#: Examples per operation and generation mode (a minute or less for the whole API).
EXAMPLES = 20


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_the_api_honours_its_own_document(fuzz_server: Server, mode: GenerationMode) -> None:
    """Every operation of the served document, valid (positive) and invalid (negative)
    inputs. (schemathesis' pytest loader needs a pytest internal that pytest 9 removed,
    so the operations are driven here with hypothesis directly.)"""
    schema = schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")
    headers = {"Authorization": f"Bearer {TOKEN}"}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 12
    for operation in operations:
        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case: schemathesis.Case) -> None:
            case.call_and_validate(base_url=fuzz_server.url, headers=headers, checks=CHECKS)

        try:
            check()
        except Unsatisfiable:
            # An operation without inputs has no invalid form to generate.
            assert mode is GenerationMode.NEGATIVE, operation.label
