"""Configuration: one typed Settings object, read from NORMSERVE_* environment variables."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _lower(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


def _token(value: object) -> object:
    """The admin token without surrounding whitespace (a Secret made from a file ends in a newline), and only
    printable ASCII without spaces, as `Authorization: Bearer <token>` can carry it. The error never quotes it."""
    if not isinstance(value, str):
        return value
    token = value.strip(string.whitespace)  # ASCII only: a no-break space is refused below, not dropped
    if not all("!" <= ch <= "~" for ch in token):
        raise ValueError(
            "NORMSERVE_ADMIN_TOKEN must be printable ASCII without spaces or control characters inside "
            "(a bearer token); the value set is not"
        )
    return token


class Settings(BaseSettings):
    """Every knob of the service; tests construct Settings(...) directly instead of patching the environment."""

    # hide_input_in_errors: a refused NORMSERVE_ADMIN_TOKEN must not be printed in the error that refuses it.
    model_config = SettingsConfigDict(env_prefix="NORMSERVE_", frozen=True, hide_input_in_errors=True)

    model_dir: Path = Field(Path("models"), description="The model repository: <name>/<version>/ folders.")
    # As Triton's --model-control-mode: none loads every model at start, explicit through the repository API
    # (/v2/repository), poll rescans the folder every poll_interval_s.
    model_control: Annotated[Literal["none", "explicit", "poll"], BeforeValidator(_lower)] = Field(
        "none", description="Model control: none, explicit or poll."
    )
    startup_models: str = Field(
        "*", description="explicit mode: comma-separated models loaded at start (* = all, empty = none)."
    )
    poll_interval_s: float = Field(5.0, gt=0, description="poll mode: how often the repository is rescanned.")
    # A load or unload waits behind the others of the server, holding no thread meanwhile (app/server/operations.py);
    # past this it answers 503 (UNAVAILABLE), well before a client's usual 60 s timeout would give up on it unanswered.
    model_control_wait_s: float = Field(
        30.0, gt=0, description="explicit mode: how long a load or unload may wait behind others before a 503."
    )
    # Where a server's workers share their model state and claim the gRPC port: it must be this user's alone
    # (app/server/group.py checks owner and mode 0700 at start and refuses any other).
    runtime_dir: str = Field(
        "",
        description="Private folder for the workers' shared state and gRPC port claims "
        "(empty = $XDG_RUNTIME_DIR/normserve, else <temp>/normserve-UID).",
    )
    admin_token: Annotated[str, BeforeValidator(_token)] = Field(
        "",
        repr=False,  # never in a log line or a traceback
        description="Bearer token for the repository, trace and logging routes (empty = those routes closed).",
    )
    host: str = Field("127.0.0.1", description="Address `normserve serve` binds to.")
    port: int = Field(8000, ge=0, le=65535, description="Port `normserve serve` listens on.")
    workers: int = Field(1, ge=1, description="uvicorn worker processes for `normserve serve`.")
    # Every worker serves it on the same port (SO_REUSEPORT), which no other server may take: app/server/group.py.
    grpc_port: int = Field(8001, ge=0, le=65535, description="Port of the gRPC Open Inference Protocol (0 = off).")
    # 1,200 connections that sent only the HTTP/2 preface, renewed as they closed, kept the gRPC port's connection
    # limit full: 42 of 44 ServerLive calls UNAVAILABLE (issue 37, D7). Probes on a port of their own always get in.
    grpc_health_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="gRPC: a port of its own for probes (Health/Check, ServerLive, ServerReady) only (0 = off).",
    )
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1, description="Largest request body, also after decompression.")
    max_elements: int = Field(16_777_216, ge=1, description="Largest element count of any one tensor.")
    max_depth: int = Field(32, ge=1, description="Deepest JSON nesting of arrays, which bounds a tensor's rank.")
    max_in_flight: int = Field(64, ge=1, description="Inference requests per worker at once; more get 503.")
    # 256 MiB: a worker peaks within 4x the bodies it holds (docs/reliability.md), so 1 GiB over its ~0.35 GiB
    # at rest, inside the shipped 2 GiB pod limit; docs/operations.md gives the formula for other sizes.
    max_inflight_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024,
        description="Request body bytes per worker at once (all transports); past it a request waits 1 s, then 503.",
    )
    # 1 MiB/s: a stalled body held the room its Content-Length promised until NORMSERVE_BODY_TIMEOUT_S, and
    # four that announced 64 MiB refused every request for 30 s (issue 37). Only applied while others wait.
    min_body_rate: int = Field(
        1024 * 1024,
        ge=0,
        description="Bytes/s a body must keep up while others wait for room in the budget; slower: 408 (0 = off).",
    )
    # Streams that sent nothing took every RPC slot of a worker for as long as they stayed open (issue 37).
    stream_idle_s: float = Field(
        60.0, gt=0, description="gRPC: a ModelStreamInfer stream with no request in flight for this long is ended."
    )
    request_timeout_s: float = Field(60.0, gt=0, description="Longest a request may wait for its inference.")
    # From the moment the route starts reading: a client that trickles its body gets 408 and a closed connection.
    body_timeout_s: float = Field(30.0, gt=0, description="Longest a request body may take to arrive; then 408.")
    # uvicorn closes no connection before its first request head: 1,100 that sent nothing starved a worker.
    header_timeout_s: float = Field(
        10.0, gt=0, le=3600, description="Longest a connection may take to send a whole request head; then closed."
    )
    max_connections: int = Field(
        1000, ge=1, description="HTTP connections per worker (and gRPC ones); past it an idle or half-sent one closes."
    )
    drain_timeout_s: float = Field(30.0, ge=0, description="On SIGTERM, how long in-flight requests may finish.")
    # 1, measured (docs/benchmarks.md, threads table): requests run concurrently in threads, and workers = cores,
    # so runs overlap, and then a second intra-op thread only fights them: with two callers at (8,128,768),
    # 0.75 ms per run with 1 thread, 0.92 ms with 2. A large request alone runs ~2x faster with 2 (0.74 vs
    # 1.43 ms): a single-worker, one-request-at-a-time deployment may set 0 (one thread per core).
    intra_op_threads: int = Field(1, ge=0, description="onnxruntime intra-op threads per session (0 = cores).")
    # On, for short sequences only, measured (docs/benchmarks.md, section 4): one run of 8 merged sequences
    # costs 0.36x the CPU of 8 runs of one at seq 8, 0.57x at 16, 0.85x at 64, 1.01x at 96 and 1.10x at 128,
    # and /encode (1,16,128) at concurrency 16 gained 1.16x req/s with p99 at concurrency 1 unchanged (a
    # request alone in the worker runs at once), while (1,128,128) gained nothing. Longer sequences run alone.
    batch_max_size: int = Field(8, ge=1, description="Dynamic batching: most requests merged into one run (1 = off).")
    batch_delay_us: int = Field(2000, ge=0, description="Dynamic batching: how long a batch waits to fill.")
    batch_max_seq_len: int = Field(64, ge=1, description="Dynamic batching: longer sequences are never merged.")
    # OpenAI's own limit on inputs is 2048 per request; the tokens bound what one request may cost a worker.
    max_request_tokens: int = Field(
        300_000, ge=1, description="Text encoders: most tokens (special ones included) of one request's texts."
    )
    # 4096 padded tokens: a run of all-MiniLM-L6-v2 holds ~56 KiB per token at its peak (16 texts of 256 tokens:
    # 425 MiB of the process against 197 MiB idle; 32 texts: 661 MiB), and a pooled run may overlap one request
    # run alone, so 8 requests of 256 texts of 256 tokens stay under a 1 GiB worker (tests/server/api/openai).
    text_batch_tokens: int = Field(
        4096, ge=1, description="Text encoders: texts run in groups of similar length of at most this many tokens."
    )
    log_level: Annotated[Literal["debug", "info", "warning", "error", "critical"], BeforeValidator(_lower)] = Field(
        "info", description="Log level: debug, info, warning, error, critical."
    )
    validate_atol: float = Field(1e-4, gt=0, description="Tolerance of `validate: true` for the encoders.")
    # The LayerNorm drift monitor (app/core/monitor.py): at 1 every request's per-position statistics are counted.
    monitor_sample: float = Field(
        1.0, ge=0, le=1, description="Fraction of requests whose LayerNorm statistics the monitor counts (0 = off)."
    )
    # 300 s: five minutes of traffic against the baseline, the span Prometheus' rate() windows usually take; the
    # window slides in tenths of it (monitor.WINDOW_SLOTS).
    monitor_window_s: float = Field(
        300.0, gt=0, description="The drift monitor's sliding window: the PSI compares its stds with the baseline."
    )
