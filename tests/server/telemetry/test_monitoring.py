"""app/server/telemetry/monitoring.py and the data plane's monitor hooks, on a real server: the live LayerNorm
histograms and drift series per model version and layer, GET /v2/models/{name}/monitor, and the scaling signals
(normserve_pending_requests, normserve_queue_seconds). The drift alert end to end is tests/suites/test_prometheus.py."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from tests.live_server import MODELS, live_server
from tests.server.prometheus import delta, scrape, scrape_until_moved, value

MODEL_NAMES = ["encoder", "encoder-preln", "layernorm"]


@pytest.fixture(scope="module")
def steady() -> Iterator[httpx.Client]:
    """A server of its own whose drift window outlasts the module: the session server's 300 s window drops the
    slots that earlier tests filled, and a slot dropped between two scrapes reads as samples lost."""
    with live_server({"NORMSERVE_MONITOR_WINDOW_S": "86400"}) as base, httpx.Client(base_url=base, timeout=60) as c:
        yield c


def baseline_layers(model: str) -> list[str]:
    return list(json.loads((MODELS / model / "1" / "manifest.json").read_text())["baseline"]["layers"])


@pytest.mark.parametrize("route", ["/v2/models/{}/monitor", "/v2/models/{}/versions/1/monitor"])
@pytest.mark.parametrize("model", MODEL_NAMES)
def test_monitor_route_reports_every_baseline_layer(client: httpx.Client, model: str, route: str) -> None:
    r = client.get(route.format(model))
    assert r.status_code == 200
    doc = r.json()
    assert (doc["model"], doc["version"], doc["window_s"]) == (model, "1", 300.0)
    assert [layer["name"] for layer in doc["layers"]] == baseline_layers(model)
    for layer in doc["layers"]:
        assert set(layer) == {"name", "psi", "verdict", "samples", "baseline", "live"}
        assert len(layer["live"]["counts"]) == len(layer["live"]["expected"]) == len(layer["live"]["std_bins"]) + 1


@pytest.mark.parametrize("route", ["/v2/models/nosuch/monitor", "/v2/models/layernorm/versions/9/monitor"])
def test_monitor_of_an_unknown_model_or_version_is_404(client: httpx.Client, route: str) -> None:
    assert client.get(route).status_code == 404


@pytest.mark.parametrize("rows", [1, 5])
def test_every_row_of_a_normalize_counts_in_the_layernorm_histograms_and_window(
    steady: httpx.Client, rows: int
) -> None:
    client = steady
    data = np.random.default_rng(rows).normal(2.0, 3.0, size=(rows, 16))
    labels = {"model": "layernorm", "version": "1", "layer": "layernorm"}
    before = scrape(client)
    assert client.post("/normalize", json={"data": data.tolist()}).status_code == 200
    after = scrape_until_moved(client, before, "normserve_layernorm_input_std_count", rows, **labels)
    assert delta(before, after, "normserve_layernorm_input_std_count", **labels) == rows
    # The mean's buckets go below 0, where OpenMetrics has no _sum (nor _count): prometheus-client leaves them out.
    assert delta(before, after, "normserve_layernorm_input_mean_bucket", le="+Inf", **labels) == rows
    assert ("normserve_layernorm_input_mean_sum", tuple(sorted(labels.items()))) not in after
    sum_std = delta(before, after, "normserve_layernorm_input_std_sum", **labels)
    assert sum_std == pytest.approx(data.std(axis=1).sum(), rel=1e-4)
    assert delta(before, after, "normserve_layernorm_drift_samples", **labels) == rows
    assert value(after, "normserve_layernorm_drift", **labels) >= 0


def test_an_encoders_padded_tokens_never_count(steady: httpx.Client) -> None:
    client = steady
    x = np.random.default_rng(0).normal(size=(2, 6, 128)).astype(np.float32)
    mask = [[False] * 6, [False] * 2 + [True] * 4]  # 6 + 2 unpadded tokens
    labels = {"model": "encoder", "version": "1", "layer": "layers.1.norm2"}
    before = scrape(client)
    r = client.post("/encode", json={"data": x.tolist(), "padding_mask": mask})
    assert r.status_code == 200, r.text
    after = scrape_until_moved(client, before, "normserve_layernorm_input_std_count", 8, **labels)
    assert delta(before, after, "normserve_layernorm_input_std_count", **labels) == 8
    assert delta(before, after, "normserve_layernorm_drift_samples", **labels) == 8


@pytest.mark.parametrize("n", [1, 3])
def test_each_request_has_a_queue_time_and_none_stays_pending(client: httpx.Client, n: int) -> None:
    before = scrape(client)
    for _ in range(n):
        assert client.post("/v2/models/layernorm/infer", json=_v2_rows(2)).status_code == 200
    after = scrape_until_moved(client, before, "normserve_queue_seconds_count", n, model="layernorm")
    assert delta(before, after, "normserve_queue_seconds_count", model="layernorm") == n
    assert delta(before, after, "normserve_queue_seconds_bucket", le="60.0", model="layernorm") == n
    assert value(after, "normserve_pending_requests", model="layernorm") == 0


def _v2_rows(rows: int) -> dict[str, object]:
    return {"inputs": [{"name": "input", "shape": [rows, 3], "datatype": "FP32", "data": [0.5, 1.0, 2.0] * rows}]}


@pytest.fixture(scope="module")
def text_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, list[str]]]:
    """A tiny random BERT exported as `tiny` (its baseline on the parity texts), served alone; its LayerNorms."""
    from app.export.textexport import export_text_encoder
    from tests.textmodels import tiny_model

    folder = tmp_path_factory.mktemp("text-monitor")
    done = export_text_encoder(folder / "models", "tiny", tiny_model(folder / "hf", "bert").path)
    env = {"NORMSERVE_MODEL_DIR": str(folder / "models"), "NORMSERVE_MONITOR_WINDOW_S": "86400"}
    with live_server(env) as base, httpx.Client(base_url=base, timeout=60) as c:
        yield c, done.manifest["layer_norms"]


@pytest.mark.parametrize("asked", [False, True], ids=["statistics-not-asked", "statistics-asked"])
def test_every_real_token_of_v1_embeddings_counts_in_each_layernorms_window(
    text_server: tuple[httpx.Client, list[str]], asked: bool
) -> None:
    """Texts of different lengths (padded together): the tokens the model ran count, padding never; the answer
    carries the statistics only when the client asks for them."""
    client, layers = text_server
    texts = ["a", "Hello, world!", "The quick brown fox jumps over the lazy dog."]
    before = scrape(client)
    r = client.post("/v1/embeddings", json={"model": "tiny", "input": texts, "return_layer_norms": asked})
    assert r.status_code == 200, r.text
    tokens = r.json()["usage"]["prompt_tokens"]
    assert all(("layer_norms" in item) is asked for item in r.json()["data"])
    labels = {"model": "tiny", "version": "1", "layer": layers[-1]}
    after = scrape_until_moved(client, before, "normserve_layernorm_drift_samples", tokens, **labels)
    counted = {
        layer: delta(before, after, "normserve_layernorm_drift_samples", **(labels | {"layer": layer}))
        for layer in layers
    }
    assert counted == dict.fromkeys(layers, float(tokens))
