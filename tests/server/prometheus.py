"""Reading GET /metrics in tests: samples by name and labels, and how much one moved between two scrapes."""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from app.server.telemetry import metrics

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(client: httpx.Client) -> Samples:
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"] == metrics.CONTENT_TYPE
    return parse(r.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def scrape_until_moved(client: httpx.Client, before: Samples, name: str, by: float, **labels: str) -> Samples:
    """Scrape until the sample has moved by `by` since `before` (a request is recorded once its response has gone
    out, maybe a moment after the client has it all), or for at most 5 s; the last scrape either way."""
    deadline = time.monotonic() + 5
    while delta(before, after := scrape(client), name, **labels) < by and time.monotonic() < deadline:
        time.sleep(0.01)
    return after
