"""The `route` label of requests that no APIRoute answers: the docs, the OpenAPI document and static files.

FastAPI records only its APIRoutes in the scope; its plain routes (/openapi.json) and mounts (/static,
/docs/assets) get their own bounded labels too, and only a path that no route knows is `unmatched`.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.server.prometheus import Samples, delta, scrape

REQUESTS = "normserve_http_requests_total"
# The routes that the OpenAPI document leaves out: the playground, its files, the docs and their files.
UNDOCUMENTED = {"/", "/static", "/docs", "/docs/assets", "/openapi.json", "/v2/"}  # /v2/: as /v2, unlisted


def counted_since(client: httpx.Client, before: Samples) -> tuple[Samples, dict[str, float]]:
    """The next scrape that shows a request counted since `before`, and the change per route (the scrapes left out).

    The count is recorded once the response's last byte is sent, which the client may see first: poll briefly.
    """
    deadline = time.monotonic() + 5
    while True:
        after = scrape(client)
        changed = {
            dict(labels)["route"]: value - before.get((name, labels), 0.0)
            for (name, labels), value in after.items()
            if name == REQUESTS and value != before.get((name, labels), 0.0) and dict(labels)["route"] != "/metrics"
        }
        if changed or time.monotonic() > deadline:
            return after, changed
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("method", "path", "route", "status"),
    [
        ("GET", "/docs", "/docs", "200"),
        ("POST", "/docs", "/docs", "405"),
        ("GET", "/docs/assets/swagger-ui.css", "/docs/assets", "200"),
        ("GET", "/docs/assets/no-such-asset.js", "/docs/assets", "404"),
        ("GET", "/openapi.json", "/openapi.json", "200"),
        ("GET", "/static/app.js", "/static", "200"),
        ("GET", "/static/no-such-file.js", "/static", "404"),
        ("GET", "/", "/", "200"),
        ("GET", "/redoc", "unmatched", "404"),
        ("GET", "/docs/oauth2-redirect", "unmatched", "404"),
        ("GET", "/no/such/path/91c2", "unmatched", "404"),
    ],
)
def test_docs_openapi_and_static_files_have_their_own_labels(
    client: httpx.Client, method: str, path: str, route: str, status: str
) -> None:
    before = scrape(client)
    assert client.request(method, path).status_code == int(status)
    after, changed = counted_since(client, before)
    assert changed == {route: 1.0}  # this request, counted once, under its label and no other
    assert delta(before, after, REQUESTS, method=method, route=route, status=status) == 1


def test_every_route_label_is_a_route_of_the_app_or_unmatched(client: httpx.Client) -> None:
    for i in range(20):  # raw paths under every prefix: none may become a label value of its own
        for prefix in ("/static/", "/docs/assets/", "/docs/", "/"):
            client.get(f"{prefix}probe-{i}")
    labels = {dict(key[1]).get("route") for key in scrape(client) if key[0] == REQUESTS}
    known = set(client.get("/openapi.json").json()["paths"]) | UNDOCUMENTED | {"unmatched"}
    assert labels <= known, labels - known
    assert {"/static", "/docs/assets", "unmatched"} <= labels
