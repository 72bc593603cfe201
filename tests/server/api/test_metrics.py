"""app/server/api/metrics.py: GET /metrics answers the Prometheus text format, with every normserve family, and its
counters move with the requests answered (the scrapes themselves included)."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.server.telemetry import metrics
from tests.server.prometheus import delta, scrape, scrape_until_moved

FAMILIES = [
    ("normserve_http_requests", "counter"),
    ("normserve_http_request_duration_seconds", "histogram"),
    ("normserve_inference_duration_seconds", "histogram"),
    ("normserve_inference_batch_size", "histogram"),
    ("normserve_inference_requests_in_flight", "gauge"),
    ("normserve_model_load_seconds", "gauge"),
    ("normserve_model_parity_max_abs_diff", "gauge"),
    ("normserve_model_parity_tolerance", "gauge"),
    ("normserve_model_ready", "gauge"),
    ("normserve_model_load_failures", "counter"),
    ("normserve_inference_requests_in_flight_limit", "gauge"),
    ("normserve_ready", "gauge"),
]


def test_metrics_is_the_prometheus_text_format(client: httpx.Client) -> None:
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"] == metrics.CONTENT_TYPE == "text/plain; version=1.0.0; charset=utf-8"
    assert list(text_string_to_metric_families(r.text))  # parses as a whole
    assert "_created" not in r.text  # no *_created series


@pytest.mark.parametrize(("name", "kind"), FAMILIES, ids=[f[0] for f in FAMILIES])
def test_metrics_has_each_normserve_family_with_its_type(client: httpx.Client, name: str, kind: str) -> None:
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    assert families[name].type == kind and families[name].documentation


def test_a_request_moves_its_counter_by_one(client: httpx.Client) -> None:
    labels = {"method": "POST", "route": "/normalize", "status": "200"}
    before = scrape(client)
    assert client.post("/normalize", json={"data": [[0.5, 1.0]]}).status_code == 200
    after = scrape_until_moved(client, before, "normserve_http_requests_total", 1, **labels)
    assert delta(before, after, "normserve_http_requests_total", **labels) == 1


def test_each_scrape_counts_the_one_before_it(client: httpx.Client) -> None:
    labels = {"method": "GET", "route": "/metrics", "status": "200"}
    first = scrape(client)
    second = scrape_until_moved(client, first, "normserve_http_requests_total", 1, **labels)
    assert delta(first, second, "normserve_http_requests_total", **labels) == 1
