"""Slow clients: a body that trickles in is answered 408 at NORMSERVE_BODY_TIMEOUT_S and its connection closed.

Before the deadline, 1,500 clients sending one byte a second were held open for as long as they liked,
each with its socket and its part-read body. Here the deadline is 0.5 s (2 s for the many-clients test,
which needs the time to open its connections), the clients are raw sockets on 127.0.0.1, and the server
is the one `normserve serve` runs (uvicorn with httptools; tests/suites/test_http_abuse.py runs h11 too).
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from app.core.runtime import Runtime
from tests.live_server import live_server
from tests.suites.test_hostile import ENDPOINTS, assert_still_right, valid_body

DEADLINE_S = 0.5
MANY = 200
MANY_DEADLINE_S = 2.0
SLACK_S = 1.0  # an answer at the deadline may wait this long for a turn of 2 shared cores
TOO_SLOW = '{{"error":"body: did not arrive in full within {:g} s (NORMSERVE_BODY_TIMEOUT_S)"}}'


def address(base: str) -> tuple[str, int]:
    host, port = base.removeprefix("http://").split(":")
    return host, int(port)


@pytest.fixture(scope="module")
def slow_deadline() -> Iterator[str]:
    with live_server({"NORMSERVE_BODY_TIMEOUT_S": str(DEADLINE_S)}) as base:
        yield base


async def trickle(host: str, port: int, path: str, every_s: float) -> tuple[bytes, float]:
    """Announce a 1,000-byte body, send one byte every `every_s`: (the server's answer, seconds until it closed)."""
    reader, writer = await asyncio.open_connection(host, port)
    started = time.monotonic()
    writer.write(f"POST {path} HTTP/1.1\r\nHost: normserve\r\nContent-Length: 1000\r\n\r\n".encode())
    reading = asyncio.ensure_future(read_until_closed(reader))
    while not reading.done():
        try:
            writer.write(b" ")
            await writer.drain()
        except ConnectionError:  # closed under us: the answer is already in our buffer
            break
        await asyncio.wait({reading}, timeout=every_s)
    answer = await asyncio.wait_for(reading, timeout=30)
    writer.close()
    return answer, time.monotonic() - started


async def read_until_closed(reader: asyncio.StreamReader) -> bytes:
    answer = b""
    try:
        while chunk := await reader.read(1 << 16):
            answer += chunk
    except ConnectionResetError:  # our last byte met a closed socket: a reset, after the answer
        pass
    return answer


def status_and_body(answer: bytes) -> tuple[int, bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_trickled_body_is_answered_408_at_the_deadline_and_closed(
    slow_deadline: str, runtime: Runtime, endpoint: str
) -> None:
    answer, seconds = asyncio.run(trickle(*address(slow_deadline), endpoint, every_s=0.05))
    assert status_and_body(answer) == (408, TOO_SLOW.format(DEADLINE_S).encode())
    assert DEADLINE_S <= seconds < DEADLINE_S + SLACK_S
    with httpx.Client(base_url=slow_deadline, timeout=30) as client:
        assert_still_right(client, endpoint, runtime)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_body_that_pauses_but_arrives_within_the_deadline_is_answered(
    slow_deadline: str, runtime: Runtime, endpoint: str
) -> None:
    body = valid_body(endpoint)

    def parts() -> Iterator[bytes]:
        yield body[: len(body) // 2]
        time.sleep(DEADLINE_S / 2)  # the deadline is the whole body's, not a gap's: half of it is spent here
        yield body[len(body) // 2 :]

    with httpx.Client(base_url=slow_deadline, timeout=30) as client:
        r = client.post(endpoint, content=parts(), headers={"Content-Type": "application/json"})
        assert r.status_code == 200, r.text
        assert_still_right(client, endpoint, runtime)


async def many_trickles(base: str, path: str, n: int) -> list[tuple[bytes, float]]:
    return await asyncio.gather(*(trickle(*address(base), path, every_s=1.0) for _ in range(n)))


def valid_latencies(base: str, stop: threading.Event, runtime: Runtime, out: list[float], errors: list[str]) -> None:
    """Valid /normalize requests one after another until `stop`, each checked: their latencies into `out`."""
    with httpx.Client(base_url=base, timeout=30) as client:
        while not stop.is_set():
            started = time.monotonic()
            try:
                assert_still_right(client, "/normalize", runtime)
            except (AssertionError, httpx.HTTPError) as e:  # reported by the test's own thread
                errors.append(repr(e))
            out.append(time.monotonic() - started)
            time.sleep(0.05)


@pytest.mark.slow
def test_many_trickling_clients_are_all_answered_408_and_closed_while_valid_requests_stay_fast(
    runtime: Runtime,
) -> None:
    latencies: list[float] = []
    errors: list[str] = []
    stop = threading.Event()
    with live_server({"NORMSERVE_BODY_TIMEOUT_S": str(MANY_DEADLINE_S)}) as base:
        prober = threading.Thread(target=valid_latencies, args=(base, stop, runtime, latencies, errors))
        prober.start()
        try:
            results = asyncio.run(many_trickles(base, "/v2/models/layernorm/infer", MANY))
        finally:
            stop.set()
            prober.join()
    answers = [status_and_body(answer) for answer, _ in results]
    closed_after = sorted(seconds for _, seconds in results)
    assert answers == [(408, TOO_SLOW.format(MANY_DEADLINE_S).encode())] * MANY
    assert MANY_DEADLINE_S <= closed_after[0] and closed_after[-1] < MANY_DEADLINE_S + SLACK_S
    assert errors == []
    assert len(latencies) > 10 and max(latencies) < 1.0, latencies
    print(
        f"\n{MANY} trickling clients: all 408, closed {closed_after[0]:.2f}-{closed_after[-1]:.2f} s after their"
        f" headers (deadline {MANY_DEADLINE_S} s); {len(latencies)} valid requests meanwhile: median"
        f" {statistics.median(latencies) * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms"
    )
