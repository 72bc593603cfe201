"""parameters.py: an infer request's parameters, read alike from both V2 transports; every message whole."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.runtime import Runtime
from app.server.api.v2 import parameters
from tests.server.api.v2.refusals import refused as _refused

READS = "(it reads eps, eps_mode, normalized_ndim; other names are ignored)"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ([1], "parameters: expected an object, got [1]"),
        ({"binary_data_output": 1}, "parameters.binary_data_output: expected true or false, got 1"),
        *(
            (
                {"alpha": 1, name: 1},
                f"parameters.{name}: unknown parameter for model 'layernorm'; did you mean {known!r}? {READS}",
            )
            for name, known in [
                ("epsilon", "eps"),  # difflib's ratio 0.6
                ("Eps", "eps"),  # the same name in another case
                ("EPS", "eps"),
                ("eps2", "eps"),
                ("mode", "eps_mode"),
                ("eps_mod", "eps_mode"),  # 0.93 to eps_mode, 0.6 to eps: the closer one is meant
                ("normalized-ndim", "normalized_ndim"),  # '-' for '_'
                ("norm", "normalized_ndim"),  # a prefix of it
            ]
        ),
    ],
    ids=lambda v: str(v) if isinstance(v, (list, dict)) else None,
)
def test_parameters_close_to_the_models_own_are_refused(runtime: Runtime, params: Any, message: str) -> None:
    assert _refused(parameters.checked, params, runtime.get("layernorm")) == message


@pytest.mark.parametrize(
    ("model", "params", "ignored"),
    [
        ("layernorm", {"eps": 1e-3, "priority": 2, "binary_data_output": True}, ()),
        ("layernorm", {"alpha": 1, "eps": 1e-3, "content_type": "np", "e": 2}, ("alpha", "content_type", "e")),
        ("layernorm", {"trace_id": "t1", "ndim": 2, "beta": [1]}, ("beta", "ndim", "trace_id")),
        ("encoder", {"eps": 1, "eps_mode": "std", "timeout": 5}, ("eps", "eps_mode")),  # an encoder reads none
    ],
    ids=["known", "far-from-eps", "far-from-all", "encoder"],
)
def test_other_parameters_pass_through_and_are_listed_as_ignored(
    runtime: Runtime, model: str, params: dict[str, Any], ignored: tuple[str, ...]
) -> None:
    assert parameters.checked(params, runtime.get(model)) == params
    assert parameters.ignored(params, runtime.get(model)) == ignored


def test_no_parameters_are_none_ignored(runtime: Runtime) -> None:
    assert parameters.checked(None, runtime.get("layernorm")) == {}
    assert parameters.ignored({}, runtime.get("layernorm")) == ()


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"eps": "0.001"}, {"eps": 0.001}),
        ({"eps": "1E-5", "normalized_ndim": "2"}, {"eps": 1e-5, "normalized_ndim": 2}),
        ({"eps": "+.5", "normalized_ndim": "-1"}, {"eps": 0.5, "normalized_ndim": -1}),  # -1: refused by the model
        ({"eps": "abc", "normalized_ndim": "2.0"}, {"eps": "abc", "normalized_ndim": "2.0"}),  # named by the model
        ({"eps": "nan"}, {"eps": "nan"}),
        ({"eps": "1e999"}, {"eps": "1e999"}),  # not finite: stays as sent
        ({"eps": " 0.1"}, {"eps": " 0.1"}),
        ({"eps": "\u0661e-3", "normalized_ndim": "\u0661"}, {"eps": "\u0661e-3", "normalized_ndim": "\u0661"}),
        ({"eps": "\uff11e-3", "normalized_ndim": "\uff12"}, {"eps": "\uff11e-3", "normalized_ndim": "\uff12"}),
        ({"eps_mode": "1"}, {"eps_mode": "1"}),  # a string parameter stays a string
        ({"sequence_id": "7"}, {"sequence_id": "7"}),  # the protocol's own: unread, unchanged
        ({"eps": 0.25, "normalized_ndim": 1}, {"eps": 0.25, "normalized_ndim": 1}),
    ],
)
def test_strings_that_spell_numbers_are_read_as_numbers_where_the_parameter_is_one(
    runtime: Runtime, params: dict[str, Any], expected: dict[str, Any]
) -> None:
    got = parameters.checked(params, runtime.get("layernorm"))
    assert got == expected and [type(v) for v in got.values()] == [type(v) for v in expected.values()]
