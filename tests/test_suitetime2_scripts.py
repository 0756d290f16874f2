"""scripts/profile_bytes_same.py's comparison: a profile's byte fields and parameter counts, layer by
layer, and nothing timed."""

from __future__ import annotations

from fixtures.scripts import load_script


def test_the_compared_fields_are_a_layers_bytes_and_parameters_not_its_times():
    same = load_script("profile_bytes_same")
    profile = {"layers": [{"name": "0", "act_bytes": 4096, "input_bytes": 512, "fwd_ms": 1.5, "param_count": 10},
                          {"name": "1", "act_bytes": 8192, "bwd_ms": 2.0, "param_count": 0}]}
    assert same.byte_fields(profile) == [("0", "act_bytes", 4096), ("0", "input_bytes", 512), ("0", "param_count", 10),
                                         ("1", "act_bytes", 8192), ("1", "param_count", 0)]
    timed_again = {"layers": [dict(layer, fwd_ms=9.0, bwd_ms=9.0) for layer in profile["layers"]]}
    assert same.byte_fields(timed_again) == same.byte_fields(profile)
