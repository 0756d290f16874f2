"""Fake profiles of fine-tuning models record which layers' inputs need a gradient and what each layer trains, as
measured ones do (kinds.input_grads, LayerProfile.trained_param_count and param_tensors): a frozen front is charged no
backward, no gradient buffers, no gradient nor optimizer state. Before, a fake profile recorded None (every input
but the batch needing a gradient) and every parameter as trained: frozen_front's stage 0, 1 | 2, 3 was planned at
10,624 B against the measured profile's 3,456 (docs/published-runs.md §66.fakefrozen)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.cli import run_ok

from planner import io
from planner.cost import costmodel, rules
from planner.cost.layers import layer_costs
from planner.schema import StagePlan

FIXTURES = Path(__file__).parent / "fixtures"
ROWS = 4
# (the layers' input_requires_grad, trained_param_count, param_tensors), by hand: frozen_front's Linears 8-16 and
# 16-16 frozen, 16-16 (272) and 16-2 (34) trained; frozen_mlp's Linear 8-8 frozen, a ReLU, a Linear 8-8 with its bias
# frozen (64 of 72 trained, 1 tensor), a Linear 8-2 (18)
BY_HAND = {"frozen_front": ([False, False, False, True], [0, 0, 272, 34], [0, 0, 2, 2]),
           "frozen_mlp": ([False, False, False, True], [0, 0, 64, 18], [0, 0, 1, 2])}
# what a fake profile on the CPU in float32 records as the measured one does (not times; weight_grad_transient_bytes
# is the fake profiler's own)
SAME = ("kind", "input_requires_grad", "trained_param_count", "param_tensors", "param_count", "act_bytes", "input_bytes",
        "output_bytes", "input_in_act_bytes", "input_shared_bytes", "transient_bytes", "incoming_grad_bytes")


@pytest.fixture(scope="module", params=sorted(BY_HAND))
def profiles(request, tmp_path_factory):
    """(model, measured profile, fake profile, folder): both at 4 rows a microbatch, on the CPU in float32."""
    folder = tmp_path_factory.mktemp(request.param)
    model = folder / "model.py"
    model.write_text((FIXTURES / f"{request.param}.py").read_text())
    run_ok("profile", model, "--micro-batch-size", str(ROWS), "--threads", "1", "--repeats", "1", "--warmup", "0",
           "--out", folder / "measured.json")
    run_ok("profile", model, "--micro-batch-size", str(ROWS), "--fake", "--device", "cpu", "--dtype", "float32",
           "--out", folder / "fake.json")
    return request.param, io.load_profile(folder / "measured.json"), io.load_profile(folder / "fake.json"), folder


def test_a_fake_profile_records_what_needs_a_gradient_as_a_measured_one(profiles):
    model, measured, fake, _ = profiles
    for profile in (measured, fake):
        assert ([layer.input_requires_grad for layer in profile.layers], [layer.trained_param_count for layer in
                profile.layers], [layer.param_tensors for layer in profile.layers]) == BY_HAND[model]
    for ours, theirs in zip(fake.layers, measured.layers, strict=True):
        assert {field: getattr(ours, field) for field in SAME} == {field: getattr(theirs, field) for field in SAME}
        assert [(o.name, o.kept_bytes, o.recompute_peak_bytes) for o in ours.recompute_options] == \
               [(o.name, o.kept_bytes, o.recompute_peak_bytes) for o in theirs.recompute_options]
    assert [layer.bwd_ms for layer in fake.layers[:2]] == [0.0, 0.0]  # nothing runs backward through them
    assert [layer.step_ms["adam"] for layer in fake.layers[:2]] == [0.0, 0.0]  # nor steps them


def test_the_fake_profiles_plan_and_peaks_are_the_measured_ones(profiles):
    """The solver's plan from either profile, and stage_cost's peaks at every 2-stage cut (1F1B, 4 microbatches)."""
    model, measured, fake, folder = profiles
    plans = []
    for name in ("measured", "fake"):
        run_ok("solve", "--profile", folder / f"{name}.json", "--mem", "100MiB", "--stages", "2", "--microbatches", "4",
               "--out", folder / f"{name}.yaml")
        plans.append(io.load_plan(folder / f"{name}.yaml"))
    assert [(s.layers, s.predicted.peak_bytes) for s in plans[0].stages] == \
           [(s.layers, s.predicted.peak_bytes) for s in plans[1].stages]
    names = [layer.name for layer in measured.layers]
    for cut in range(1, len(names)):
        stages = [StagePlan(index=0, layers=names[:cut]), StagePlan(index=1, layers=names[cut:])]
        peaks = [costmodel.evaluate(stages, profile, plans[0].setup).peak_bytes_per_stage for profile in (measured, fake)]
        assert peaks[0] == peaks[1]
        if model == "frozen_front" and cut == 2:  # §46.frozen2's planned stage 0 of this cut (measured 3,200 B)
            assert peaks[1][0] == 3456


SMALL_LLAMA = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)


def test_a_transformers_model_with_its_token_embedding_frozen_profiled_fake(tmp_path):
    """A tiny LLaMA from its config (random weights) whose embedding table (256 x 64) is frozen: the embedding layer
    trains nothing and its output needs no gradient, so the first decoder's input needs none either; a stage of the
    embedding alone runs no backward and holds no receive buffer for its output's gradient."""
    pytest.importorskip("transformers")
    model = tmp_path / "hf_frozen.py"
    model.write_text("from planner.models.hfmodels import model_file\n\n"
                     f"CONFIG = {json.dumps(SMALL_LLAMA)}\n"
                     "_build, example_batch = model_file(CONFIG, seq_len=16)\n\n\n"
                     "def build_model():\n"
                     "    model = _build()\n"
                     "    model.embed.requires_grad_(False)\n"
                     "    return model\n")
    run_ok("profile", model, "--micro-batch-size", "1", "--fake", "--out", tmp_path / "p.json")
    profile = io.load_profile(tmp_path / "p.json")
    assert [layer.name for layer in profile.layers] == ["embed", "layers.0", "head"]
    assert [layer.input_requires_grad for layer in profile.layers] == [False, False, True]
    embed = profile.layers[0]
    assert (embed.param_count, embed.trained_param_count, embed.param_tensors, embed.bwd_ms) == (256 * 64, 0, 0, 0.0)
    assert [layer.trained_param_count == layer.param_count for layer in profile.layers[1:]] == [True, True]
    costs = layer_costs(profile)
    assert [(c.input_grad, c.output_grad) for c in costs] == [(False, False), (False, True), (True, True)]
    run_ok("solve", "--profile", tmp_path / "p.json", "--mem", "1GiB", "--stages", "2", "--microbatches", "4",
           "--out", tmp_path / "plan.yaml")
    assert rules.last_layer_buffer_bytes(costs[0], 0, io.load_plan(tmp_path / "plan.yaml").setup) == 0
