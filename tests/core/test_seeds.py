"""The seeds' golden vectors (app.core.seeds) against the float64 NumPy reference, and the copies built from them."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from app.core import reference, seeds
from app.core.seeds import LAYER_NORM_EXAMPLES, SEED002_POSITIONAL_ENCODING, LayerNormExample
from tests.live_server import ROOT

APP = ROOT / "app"


@pytest.mark.parametrize("example", LAYER_NORM_EXAMPLES, ids=lambda e: e.name)
def test_reference_reproduces_the_seeds_numbers(example: LayerNormExample) -> None:
    r = reference.layer_norm(np.asarray(example.x), example.k, example.eps, example.eps_mode)
    np.testing.assert_allclose(r.output, example.output, rtol=0, atol=example.atol)
    np.testing.assert_allclose(r.mean, example.mean, rtol=0, atol=example.atol)
    np.testing.assert_allclose(np.sqrt(r.var), example.std, rtol=0, atol=example.atol)
    if example.denominator is not None:
        den = np.sqrt(r.var + example.eps) if example.eps_mode == "var" else np.sqrt(r.var) + example.eps
        np.testing.assert_allclose(den, example.denominator, rtol=0, atol=example.atol)


@pytest.mark.parametrize("example", LAYER_NORM_EXAMPLES, ids=lambda e: e.name)
def test_each_example_is_consistent_in_shape_and_request(example: LayerNormExample) -> None:
    x = np.asarray(example.x)
    assert example.eps_mode in ("var", "std") and example.eps > 0 and example.about
    assert x.shape[-example.k :] == example.normalized_shape
    assert np.shape(example.output) == x.shape
    assert np.shape(example.mean) == np.shape(example.std) == x.shape[: -example.k]
    body = example.request()
    assert body["data"] == x.tolist() and isinstance(body["data"], list)
    assert body.get("normalized_shape", [x.shape[-1]]) == list(example.normalized_shape)
    assert (body.get("eps", 1e-5), body.get("eps_mode", "var")) == (example.eps, example.eps_mode)


def test_example_names_are_unique() -> None:
    assert len({e.name for e in LAYER_NORM_EXAMPLES}) == len(LAYER_NORM_EXAMPLES)


def test_reference_reproduces_seed002s_positional_encoding() -> None:
    pe = SEED002_POSITIONAL_ENCODING
    got = reference.positional_encoding(pe.max_sequence_length, pe.d_model)
    np.testing.assert_allclose(got, pe.encoding, rtol=0, atol=pe.atol)


def test_seeds_module_imports_only_numpy() -> None:
    tree = ast.parse((APP / "core" / "seeds.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "dataclasses", "typing", "numpy"}, imported
    code = (
        "import sys, app.core.seeds; print(sorted(m for m in ('torch', 'onnxruntime', 'fastapi') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=APP.parent)
    assert out.stdout.strip() == "[]"


def test_playground_example_buttons_send_the_seeds_inputs() -> None:
    # The playground is plain browser JavaScript: it keeps its own copy of the inputs, checked here.
    js = (APP / "server" / "static" / "app.js").read_text()
    found = {
        name: (json.loads(data), float(eps), mode, int(k))
        for name, data, eps, mode, k in re.findall(
            r'"example-(\w+)": \{ data: "([^"]+)", eps: "([^"]+)", mode: "(\w+)", k: (\d+) \}', js
        )
    }
    want = {
        "seed003": seeds.SEED003,
        "seed000": seeds.SEED000,
        "seed002": seeds.SEED003_LAST_TWO_DIMS,
    }
    assert found == {name: (np.asarray(e.x).tolist(), e.eps, e.eps_mode, e.k) for name, e in want.items()}


def test_openapi_examples_are_built_from_the_seeds() -> None:
    from app.server.api.rest import openapi

    content = openapi.NORMALIZE["openapi_extra"]["requestBody"]["content"]["application/json"]
    values = [ex["value"] for ex in content["examples"].values()]
    assert values[0] == seeds.SEED003.request()
    assert values[1] == seeds.SEED003_LAST_TWO_DIMS.request()
    assert values[2] == {**seeds.SEED000.request(), "validate": True}
    response = openapi.NORMALIZE["responses"][200]["content"]["application/json"]["example"]
    assert response["shape"] == list(np.shape(seeds.SEED003.x))
    np.testing.assert_allclose(response["output"], seeds.SEED003.output, rtol=0, atol=seeds.SEED003.atol)
    np.testing.assert_allclose(response["stats"]["mean"], seeds.SEED003.mean, rtol=0, atol=seeds.SEED003.atol)
    np.testing.assert_allclose(response["stats"]["std"], seeds.SEED003.std, rtol=0, atol=seeds.SEED003.atol)
    np.testing.assert_allclose(np.sqrt(response["stats"]["var"]), response["stats"]["std"], rtol=1e-12)
