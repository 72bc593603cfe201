"""schemathesis against the live server's own /openapi.json: no 5xx, and every answer as documented.

Operations are listed at collection from the app's schema (the same create_app); each test then
loads /openapi.json from the live server and runs that operation's generated cases against it with
schemathesis' default checks. Schema-violating (negative) cases run where there is a request body
to violate; path parameters are free strings, so every value is schema-valid there.

Scoped honestly: on /normalize and /encode the check "schema-valid data is accepted" is off. Their
documented body says "a nested array of numbers", and JSON Schema cannot say the rest of what a
valid tensor is (rectangular, gamma shaped like normalized_shape, d_model = 128, within float32,
a result that stays finite); those refusals are 422s that name the field, which every other
check here (status codes, content types, response schemas, no 5xx) still covers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from app.main import create_app

EXAMPLES = 25  # per operation and mode: bounded, so the whole schema runs in seconds
TENSOR_BODIES = {"POST /normalize", "POST /encode"}


def operations() -> list[Any]:
    cases = []
    for path, item in create_app().openapi()["paths"].items():
        for method, spec in item.items():
            label = f"{method.upper()} {path}"
            cases.append(pytest.param(label, GenerationMode.POSITIVE, id=f"{label}-positive"))
            if "requestBody" in spec:
                cases.append(pytest.param(label, GenerationMode.NEGATIVE, id=f"{label}-negative"))
    return cases


@pytest.fixture(scope="session")
def live_schema(server: str) -> Any:
    return schemathesis.openapi.from_url(f"{server}/openapi.json")


@pytest.mark.parametrize(("label", "mode"), operations())
def test_operation_never_5xx_and_answers_as_documented(live_schema: Any, label: str, mode: GenerationMode) -> None:
    operation = live_schema.find_operation_by_label(label)
    assert operation is not None, f"{label} is in the app but not in the live /openapi.json"
    excluded = [positive_data_acceptance] if label in TENSOR_BODIES else []

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(case: schemathesis.Case) -> None:
        case.call_and_validate(timeout=30, excluded_checks=excluded)

    hypothesis_test: Callable[[], None] = run
    hypothesis_test()
