"""A preset and the config.json it cites give one profile (§39.usertrial3: `--arch mixtral-8x22b` and `--arch-config`
of its config gave 140,620,634,112 against 140,630,071,296 parameters and blocks 43.5 / 97.2 against 45.2 / 103.7 ms):
the Mixtral presets carry the router as the config route reads model_type mixtral, and the 8x22B base's config its
32,000-token vocabulary (configs/hf/README.md)."""

import dataclasses
import json

import pytest
from fixtures.cli import run_ok

from planner.models import archs
from planner.models.archconfig import from_hf_config

H, F, V, LAYERS, EXPERTS, KV = 6144, 16384, 32000, 56, 8, 8 * 128


@pytest.mark.parametrize("name", ["mixtral-8x7b", "mixtral-8x22b"])
def test_the_preset_is_its_config(name):
    with open(f"configs/hf/{name}.json") as f:
        read = from_hf_config(json.load(f), where=name, name=name)
    preset = archs.ARCHS[name]
    assert dataclasses.replace(preset, source=read.source) == read  # every field but where it was read
    assert (preset.routing_weight_bytes, preset.renormalizes_top_k) == (4, True)


def test_the_two_routes_profile_mixtral_8x22b_alike(tmp_path):
    common = ("--seq-len", "512", "--micro-batch-size", "1", "--gpu", "h100")
    run_ok("profile", "--arch", "mixtral-8x22b", *common, "--out", tmp_path / "preset.json")
    run_ok("profile", "--arch-config", "configs/hf/mixtral-8x22b.json", *common, "--out", tmp_path / "config.json")
    preset, config = (json.loads((tmp_path / f"{which}.json").read_text()) for which in ("preset", "config"))
    for one, other in zip(preset["layers"], config["layers"], strict=True):
        assert one == other
    # by hand: 56 blocks (q, o 6144²; k, v 6144 x 1024; 8 experts of 3 x 6144 x 16384; the router 6144 x 8; two
    # norms) + the embedding and the untied head, 32,000 x 6144 each, + the final norm: 140,620,634,112
    block = 2 * H * H + 2 * H * KV + EXPERTS * 3 * H * F + H * EXPERTS + 2 * H
    total = sum(layer["param_count"] for layer in preset["layers"])
    assert total == LAYERS * block + 2 * V * H + H == 140_620_634_112
