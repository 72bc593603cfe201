"""messages.py: metadata, Triton's model config, statistics and the repository index, from what HTTP reports too."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from app import __version__
from app.core.runtime import Runtime
from app.core.versionstate import IndexRow, State
from app.server.api.v2.grpc import messages
from app.server.telemetry.statistics import Statistics
from app.server.telemetry.timer import InferTimer

MODELS = ["encoder", "encoder-preln", "layernorm"]


def test_server_metadata_names_normserve_and_its_grpc_extensions() -> None:
    meta = messages.server_metadata()
    assert (meta.name, meta.version, list(meta.extensions)) == (
        "normserve",
        __version__,
        ["parameters", "statistics", "model_configuration", "model_repository", "trace", "logging"],
    )


@pytest.mark.parametrize("versions", [None, ["1", "2", "10"]], ids=["the-models", "every-serving-version"])
@pytest.mark.parametrize("name", MODELS)
def test_model_metadata_is_the_v2_metadata_it_is_given(runtime: Runtime, name: str, versions: list[str] | None) -> None:
    meta = dict(runtime.get(name).metadata)
    if versions is not None:  # what Worker.metadata answers without a version: every version serving
        meta["versions"] = versions
    got = json_format.MessageToDict(messages.model_metadata(meta), preserving_proto_field_name=True)
    assert got["versions"] == (versions or ["1"])
    want = dict(meta)
    want["inputs"] = [{**t, "shape": [str(d) for d in t["shape"]]} for t in want["inputs"]]  # int64 as JSON strings
    want["outputs"] = [{**t, "shape": [str(d) for d in t["shape"]]} for t in want["outputs"]]
    assert got == want


def test_layernorm_config_has_optional_affine_inputs_and_no_batch_dim(runtime: Runtime) -> None:
    config = messages.model_config(runtime.get("layernorm")).config
    assert (config.name, config.platform, config.backend, config.max_batch_size) == (
        "layernorm",
        "onnxruntime_onnx",
        "onnxruntime",
        0,
    )
    assert [(i.name, i.data_type, list(i.dims), i.optional) for i in config.input] == [
        ("input", mc.TYPE_FP32, [-1, -1], False),
        ("gamma", mc.TYPE_FP32, [-1], True),
        ("beta", mc.TYPE_FP32, [-1], True),
    ]
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        ("output", mc.TYPE_FP32, [-1, -1]),
        ("mean", mc.TYPE_FP32, [-1]),
        ("inv_std_dev", mc.TYPE_FP32, [-1]),
    ]


def test_encoder_config_has_a_bool_padding_mask(runtime: Runtime) -> None:
    config = messages.model_config(runtime.get("encoder")).config
    assert [(i.name, i.data_type, list(i.dims), i.optional) for i in config.input] == [
        ("input", mc.TYPE_FP32, [-1, -1, 128], False),
        ("padding_mask", mc.TYPE_BOOL, [-1, -1], True),
    ]


def test_statistics_carry_every_figure_of_the_report() -> None:
    stats = Statistics()
    timer = InferTimer()
    for stage in ("queue", "compute_input", "compute_infer", "compute_output"):
        timer.mark(stage)
    stats.record_success("layernorm", "1", timer)
    stats.record_failure("layernorm", "1", timer)
    stats.record_execution("layernorm", "1", 1234)
    report = stats.report([("layernorm", "1"), ("encoder", "1")])
    got = json_format.MessageToDict(
        messages.statistics(report), preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    for entry in got["model_stats"]:  # Triton's fields that normserve has no figures for, empty
        assert (entry.pop("memory_usage"), entry.pop("response_stats")) == ([], {})
    assert got == _int64_as_strings(report)  # protobuf's JSON writes 64-bit integers as strings
    first = messages.statistics(report).model_stats[0]
    assert (first.inference_count, first.execution_count, first.inference_stats.fail.count) == (1, 1, 1)
    assert [(b.batch_size, b.compute_infer.ns) for b in first.batch_stats] == [(1, 1234)]


def _int64_as_strings(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _int64_as_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_int64_as_strings(v) for v in value]
    return str(value) if isinstance(value, int) else value


WIRE = [
    ("encoder", "1", "READY", ""),
    ("layernorm", "1", "READY", ""),
    ("layernorm", "2", "UNAVAILABLE", "not loaded"),
    ("layernorm", "3", "LOADING", ""),
]
ROWS = [IndexRow(name, int(version), State(state), reason) for name, version, state, reason in WIRE]


@pytest.mark.parametrize(
    ("ready_only", "expected"),
    [
        (False, WIRE),
        (True, [("encoder", "1", "READY", ""), ("layernorm", "1", "READY", "")]),
    ],
    ids=["all", "ready-only"],
)
def test_repository_index_lists_the_control_rows_and_ready_only_keeps_the_ready_ones(
    ready_only: bool, expected: list[tuple[str, str, str, str]]
) -> None:
    index = messages.repository_index(ROWS, ready_only)
    assert [(m.name, m.version, m.state, m.reason) for m in index.models] == expected


def test_repository_index_of_a_loaded_runtime_has_every_version_ready(runtime: Runtime) -> None:
    index = messages.repository_index(runtime.index(), ready_only=False)
    assert [(m.name, m.version, m.state, m.reason) for m in index.models] == [(m, "1", "READY", "") for m in MODELS]
