"""POST /normalize says when float32 rounds a row's distinct values together: a `warnings` list, only then."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from app.core.seeds import SEED003


def said(row: str, value: str, to: str = "float32") -> str:
    where = f" row {row}:" if row else ""
    return (
        f"data:{where} its values differ but all round to the same {to}, {value}, "
        "so its var is 0 and its normalized values are 0"
    )


COLLAPSED = [1e8, 1e8 + 1, 1e8 + 2]  # float32 has 8 between neighbours here: all three are 100000000.0


@pytest.mark.parametrize("backend", ["onnxruntime", "numpy"])
def test_a_row_rounded_to_one_value_is_named_with_the_value(client: httpx.Client, backend: str) -> None:
    r = client.post("/normalize", json={"data": [COLLAPSED], "backend": backend, "validate": True})
    assert r.status_code == 200
    body = r.json()
    assert body["warnings"] == [said("[0]", "100000000.0")]
    assert body["output"] == [[0.0, 0.0, 0.0]] and body["stats"]["var"] == [0.0]
    assert body["validation"]["passed"] is True  # the answer is right for what the model saw: hence the warning


@pytest.mark.parametrize(
    ("request_body", "warnings"),
    [
        ({"data": [[0.2, 0.1, 0.3], COLLAPSED]}, [said("[1]", "100000000.0")]),
        ({"data": COLLAPSED}, [said("", "100000000.0")]),  # rank 1: the whole tensor is the row
        (
            {"data": [[[0.2, 0.1, 0.3]], [COLLAPSED]], "normalized_shape": [1, 3]},
            [said("[1]", "100000000.0")],
        ),
        ({"data": [[[0.5, 0.5], COLLAPSED[:2]]] * 2}, [said("[0, 1]", "100000000.0"), said("[1, 1]", "100000000.0")]),
        ({"data": [[16777216, 16777217]]}, [said("[0]", "16777216.0")]),  # integers past 2**24 as well
        ({"data": [[0.1, 0.1 + 1e-12]]}, [said("[0]", "0.10000000149011612")]),  # the float32's exact value
        ({"data": [COLLAPSED], "gamma": [1, 2, 3], "beta": [4, 5, 6]}, [said("[0]", "100000000.0")]),
        (
            {"data": [COLLAPSED] * 7},
            [said(f"[{i}]", "100000000.0") for i in range(5)]
            + ["data: 2 more rows whose values all round to one float32 each"],
        ),
    ],
    ids=["second-row", "rank-1", "k2", "batch-dims", "integers", "small-values", "affine", "seven-rows"],
)
def test_every_rounded_row_is_named_by_its_index(
    client: httpx.Client, request_body: dict[str, Any], warnings: list[str]
) -> None:
    r = client.post("/normalize", json=request_body)
    assert r.status_code == 200
    assert r.json()["warnings"] == warnings


@pytest.mark.parametrize(
    ("dtype", "row", "value"),
    [
        ("bfloat16", [1000.1, 1000.2, 1000.3], "1000.0"),  # bfloat16 has 4 between neighbours here
        ("float16", [2048.1, 2048.9, 2049.0], "2048.0"),  # float16 has 2; 2049 is a tie, to the even 2048
    ],
)
def test_a_row_rounded_together_by_its_dtype_is_named_with_that_type(
    client: httpx.Client, dtype: str, row: list[float], value: str
) -> None:
    r = client.post("/normalize", json={"data": [[0.5, 1.5, 2.5], row], "dtype": dtype})
    assert r.status_code == 200
    body = r.json()
    assert body["warnings"] == [said("[1]", value, dtype)]
    assert body["output"][1] == [0.0, 0.0, 0.0] and body["stats"]["var"][1] == 0.0


@pytest.mark.parametrize(
    "request_body",
    [
        {"data": [[1000.0, 1000.0, 1000.0]], "dtype": "bfloat16"},  # constant as sent
        {"data": [[1000, 1008, 1016]], "dtype": "bfloat16"},  # three bfloat16 values
        SEED003.request(),
        {"data": [[5, 5, 5]]},  # constant as sent: nothing was rounded together
        {"data": [[1e8, 1e8 + 8, 1e8 + 16]]},  # three float32 values
        {"data": [[0.3]]},  # one value per row
    ],
    ids=[
        "bfloat16-constant-as-sent",
        "distinct-bfloat16",
        "seed003",
        "constant-as-sent",
        "distinct-float32",
        "one-column",
    ],
)
def test_without_rounded_rows_the_answer_has_no_warnings_key(
    client: httpx.Client, request_body: dict[str, Any]
) -> None:
    r = client.post("/normalize", json=request_body)
    assert r.status_code == 200
    assert set(r.json()) == {"output", "shape", "stats", "backend", "model"}  # the fields it had before warnings


def test_the_openapi_document_describes_warnings(client: httpx.Client) -> None:
    answer = client.get("/openapi.json").json()["paths"]["/normalize"]["post"]["responses"]["200"]
    schema = answer["content"]["application/json"]["schema"]
    assert schema["properties"]["warnings"]["type"] == "array"
    assert "warnings" not in schema["required"]
    assert "round to the same float32" in schema["properties"]["warnings"]["description"]
