"""Configuration: one typed Settings object, read from NORMSERVE_* environment variables."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every knob of the service; tests construct Settings(...) directly instead of patching the environment."""

    model_config = SettingsConfigDict(env_prefix="NORMSERVE_", frozen=True)

    model_dir: Path = Field(Path("models"), description="Folder with the ONNX files and manifest.json.")
    host: str = Field("127.0.0.1", description="Address `normserve serve` binds to.")
    port: int = Field(8000, ge=0, le=65535, description="Port `normserve serve` listens on.")
    workers: int = Field(1, ge=1, description="uvicorn worker processes for `normserve serve`.")
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1, description="Largest request body, also after decompression.")
    max_elements: int = Field(16_777_216, ge=1, description="Largest element count of any one tensor.")
    max_depth: int = Field(32, ge=1, description="Deepest JSON nesting of arrays, which bounds a tensor's rank.")
    max_in_flight: int = Field(64, ge=1, description="Inference requests per worker at once; more get 503.")
    request_timeout_s: float = Field(60.0, gt=0, description="Longest a request may wait for its inference.")
    drain_timeout_s: float = Field(30.0, ge=0, description="On SIGTERM, how long in-flight requests may finish.")
    # 0 lets onnxruntime pick one thread per core; with several workers, set it so workers x threads <= cores.
    intra_op_threads: int = Field(0, ge=0, description="onnxruntime intra-op threads per session (0 = cores).")
    batch_max_size: int = Field(1, ge=1, description="Dynamic batching: most requests merged into one run (1 = off).")
    batch_delay_us: int = Field(0, ge=0, description="Dynamic batching: how long a batch waits to fill.")
    log_level: str = Field("info", description="Log level: debug, info, warning, error.")
    validate_atol: float = Field(1e-4, gt=0, description="Tolerance of `validate: true` for the encoders.")


def cpu_count() -> int:
    """Cores this process may use (the affinity mask, not the machine's total)."""
    return len(os.sched_getaffinity(0))
