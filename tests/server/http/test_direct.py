"""The hot path's shortcuts keep their answers: streamed binary answers, DirectRoute's binding."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
from fastapi import APIRouter, FastAPI
from starlette.requests import Request
from starlette.responses import Response

from app.core import reference
from app.server.api.v2.http.routes import STREAM_BYTES
from app.server.http.direct import DirectRoute, hot


@pytest.mark.parametrize("rows", [600, 2])
def test_binary_answers_large_or_small_carry_their_length_and_the_right_bytes(server: str, rows: int) -> None:
    x = np.random.default_rng(rows).standard_normal((rows, 1024)).astype(np.float32)
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "output", "parameters": {"binary_data": True}}, {"name": "mean"}],
        }
    )
    r = httpx.post(
        server + "/v2/models/layernorm/infer",
        content=header + x.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header)), "Accept-Encoding": "identity"},
        timeout=60,
    )
    assert r.status_code == 200
    assert (rows * 1024 * 4 > STREAM_BYTES) == (rows == 600)  # one streamed answer, one in one piece
    assert int(r.headers["content-length"]) == len(r.content) and "transfer-encoding" not in r.headers
    n = int(r.headers["inference-header-content-length"])
    head = orjson.loads(r.content[:n])
    assert [o["name"] for o in head["outputs"]] == ["output", "mean"]
    out = np.frombuffer(r.content[n:], np.float32).reshape(x.shape)
    np.testing.assert_allclose(out, reference.layer_norm(x, 1).output, rtol=0, atol=1e-5)
    np.testing.assert_allclose(head["outputs"][1]["data"], reference.layer_norm(x, 1).mean, rtol=1e-6)


async def _needs_a_query(request: Request, q: int) -> Response:
    return Response(str(q))


async def _fine(name: str, request: Request) -> Response:
    return Response(f"{name} {request.method}")


def test_direct_route_refuses_a_parameter_it_cannot_fill_when_the_route_is_made() -> None:
    router = APIRouter(route_class=DirectRoute)
    with pytest.raises(TypeError, match="cannot fill parameter 'q'"):
        router.add_api_route("/x", _needs_a_query, methods=["GET"])


async def _marked(name: str, request: Request) -> Response:
    return Response(f"{name} {request.method}")


@pytest.mark.parametrize(("endpoint", "is_hot"), [(_fine, False), (hot(_marked), True)], ids=["plain", "marked-hot"])
def test_direct_route_passes_path_parameters_and_the_request(endpoint: Any, is_hot: bool) -> None:
    """The `@hot` mark is on the route (for app/server/http/hotpath.py) and changes nothing else of it."""
    router = APIRouter(route_class=DirectRoute)
    router.add_api_route("/things/{name}", endpoint, methods=["POST"])
    (route,) = router.routes
    assert isinstance(route, DirectRoute) and route.hot is is_hot
    app = FastAPI()
    app.include_router(router)

    async def post() -> str:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            return (await client.post("/things/abc")).text

    assert asyncio.run(post()) == "abc POST"
    assert "/things/{name}" in app.openapi()["paths"]  # still a FastAPI route: documented


@pytest.mark.parametrize(("methods", "status"), [(["GET"], 200), (["POST"], 405)], ids=["get-route", "post-route"])
def test_head_runs_a_get_route_as_get_and_openapi_lists_only_get(methods: list[str], status: int) -> None:
    """The head of the GET's answer ("abc GET", 7 bytes); no body, as uvicorn sends it (test_health.py)."""
    router = APIRouter(route_class=DirectRoute)
    router.add_api_route("/things/{name}", _fine, methods=methods)
    app = FastAPI()
    app.include_router(router)

    async def head() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            return await client.head("/things/abc")

    r = asyncio.run(head())
    assert (r.status_code, r.content) == (status, b"")
    if status == 200:
        assert r.headers["content-length"] == str(len("abc GET"))
    assert list(app.openapi()["paths"]["/things/{name}"]) == [m.lower() for m in methods]
