"""app/server/api/v2/config.py: Triton's model configuration, built with Triton's protobuf, as JSON with numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from app.core.runtime import Runtime
from app.server.api.v2.config import model_config, to_json
from app.settings import Settings
from tests.repositories import copy_models


@pytest.mark.parametrize(
    ("name", "inputs"),
    [
        (
            "layernorm",
            [
                ("input", "TYPE_FP32", [-1, -1], False),
                ("gamma", "TYPE_FP32", [-1], True),
                ("beta", "TYPE_FP32", [-1], True),
            ],
        ),
        ("encoder", [("input", "TYPE_FP32", [-1, -1, 128], False), ("padding_mask", "TYPE_BOOL", [-1, -1], True)]),
    ],
)
def test_the_config_describes_what_the_model_accepts(runtime: Runtime, name: str, inputs: list[object]) -> None:
    doc = to_json(model_config(runtime.get(name)))
    assert (doc["name"], doc["platform"], doc["backend"], doc["max_batch_size"]) == (
        name,
        "onnxruntime_onnx",
        "onnxruntime",
        0,
    )
    assert [(i["name"], i["data_type"], i["dims"], i["optional"]) for i in doc["input"]] == inputs
    assert all(isinstance(d, int) for t in doc["input"] + doc["output"] for d in t["dims"])
    assert doc["version_policy"] == {"latest": {"num_versions": 1}}


def test_a_batching_encoder_says_so_and_a_layernorm_does_not(runtime: Runtime) -> None:
    encoder = to_json(model_config(runtime.get("encoder")))
    assert encoder["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    assert {k: v for k, v in encoder["parameters"].items() if k.startswith("max_merged")} == {
        "max_merged_rows": {"string_value": "8"},
        "max_merged_sequence_length": {"string_value": "64"},
    }
    assert "dynamic_batching" not in to_json(model_config(runtime.get("layernorm")))


@pytest.mark.parametrize("name", ["layernorm", "encoder"])
def test_the_config_lists_the_datatypes_its_fp32_tensors_also_take(runtime: Runtime, name: str) -> None:
    doc = to_json(model_config(runtime.get(name)))
    assert doc["parameters"]["datatypes"] == {"string_value": "FP32,FP64,FP16,BF16"}
    assert {t["data_type"] for t in doc["input"][:1] + doc["output"]} == {"TYPE_FP32"}


@pytest.mark.parametrize(
    ("name", "statistics"),
    [
        ("layernorm", "mean,inv_std_dev"),
        (
            "encoder",
            "layers.0.norm1.mean,layers.0.norm1.std,layers.0.norm2.mean,layers.0.norm2.std,"
            "layers.1.norm1.mean,layers.1.norm1.std,layers.1.norm2.mean,layers.1.norm2.std",
        ),
    ],
)
def test_the_config_names_the_outputs_a_half_precision_input_gets_in_fp32(
    runtime: Runtime, name: str, statistics: str
) -> None:
    doc = to_json(model_config(runtime.get(name)))
    assert doc["parameters"]["fp32_outputs_of_half_inputs"] == {"string_value": statistics}


def test_a_model_json_sets_the_policy_and_the_batching(tmp_path: Path) -> None:
    root = copy_models(tmp_path / "models", ("encoder",))
    policy = {
        "version_policy": {"specific": {"versions": [1]}},
        "dynamic_batching": {"max_batch_size": 4, "max_queue_delay_microseconds": 500},
    }
    (root / "encoder/model.json").write_text(json.dumps(policy))
    config = model_config(Runtime(Settings(model_dir=root)).build("encoder", 1))
    assert isinstance(config, mc.ModelConfig)
    doc = to_json(config)
    assert doc["version_policy"] == {"specific": {"versions": [1]}}
    assert doc["dynamic_batching"]["max_queue_delay_microseconds"] == 500
    assert doc["parameters"]["max_merged_rows"] == {"string_value": "4"}
