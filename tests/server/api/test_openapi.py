"""app/server/api/openapi.py: every route documents each status it may answer, and only those.

The document itself is fuzzed against a live server by tests/suites/test_fuzz.py (schemathesis: no 5xx,
every status, content type, header and body as documented); here, what the document says.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.main import create_app

DOCUMENT = create_app().openapi()
# a model-scoped GET: a name or version that is no name or version 400, unknown model or version 404,
# models still loading 503
MODEL = [200, 400, 404, 503]
INFER = [200, 400, 404, 408, 413, 415, 503, 504]
REPOSITORY_CONTROL = [200, 400, 401, 403, 404]  # 401/403: the admin token, or model control that is not explicit

STATUSES = {
    "POST /normalize": [200, 400, 404, 408, 413, 415, 422, 503, 504],  # 404: `model` or `version` unknown
    "POST /encode": [200, 400, 404, 408, 413, 415, 422, 503, 504],
    "GET /v2/health/live": [200],
    "GET /v2/health/ready": [200, 503],
    "GET /v2": [200],
    "GET /v2/models/stats": [200],
    "GET /v2/models/{name}": MODEL,
    "GET /v2/models/{name}/versions/{version}": MODEL,
    "GET /v2/models/{name}/ready": MODEL,
    "GET /v2/models/{name}/versions/{version}/ready": MODEL,
    "POST /v2/models/{name}/infer": INFER,
    "POST /v2/models/{name}/versions/{version}/infer": INFER,
    "GET /v2/models/{name}/stats": MODEL,
    "GET /v2/models/{name}/versions/{version}/stats": MODEL,
    "GET /v2/models/{name}/monitor": MODEL,
    "GET /v2/models/{name}/versions/{version}/monitor": MODEL,
    "GET /v2/models/{name}/config": MODEL,
    "GET /v2/models/{name}/versions/{version}/config": MODEL,
    "POST /v2/repository/index": [200, 400, 401, 403],
    "POST /v2/repository/models/{name}/load": REPOSITORY_CONTROL,
    "POST /v2/repository/models/{name}/unload": REPOSITORY_CONTROL,
    "GET /metrics": [200],
    "POST /v1/embeddings": [200, 400, 404, 408, 413, 415, 503, 504],  # 413: also past NORMSERVE_MAX_REQUEST_TOKENS
    "GET /v1/models": [200],
    "POST /tokenize": [200, 400, 404, 408, 413, 415, 503, 504],  # admitted as an inference: the timeout bounds it
}


def operations() -> dict[str, dict[str, Any]]:
    return {f"{m.upper()} {path}": op for path, item in DOCUMENT["paths"].items() for m, op in item.items()}


def test_every_operation_is_in_the_status_table() -> None:
    assert sorted(operations()) == sorted(STATUSES)


@pytest.mark.parametrize(("label", "statuses"), STATUSES.items())
def test_each_operation_documents_exactly_the_statuses_it_may_answer(label: str, statuses: list[int]) -> None:
    assert sorted(int(s) for s in operations()[label]["responses"]) == statuses


def test_fastapis_own_422_is_not_documented_since_no_route_answers_it() -> None:
    assert "HTTPValidationError" not in str(DOCUMENT)
    assert "ValidationError" not in DOCUMENT["components"]["schemas"]


@pytest.mark.parametrize("label", [label for label, statuses in STATUSES.items() if 503 in statuses])
def test_a_503_documents_its_retry_after(label: str) -> None:
    assert operations()[label]["responses"]["503"]["headers"]["Retry-After"]["required"] is True


def test_the_document_is_built_once() -> None:
    app = create_app()
    assert app.openapi() is app.openapi()
