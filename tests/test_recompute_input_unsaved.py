"""A checkpointed layer that saves none of its own input (Cohere's decoder layer: its LayerNorm starts with a
subtraction, its attention and MLP read the norm's output) recomputes everything it saves on top of the input its
checkpoint keeps: the recompute peak is act_bytes less only the part of act that is the input (input_in_act_bytes),
not less the whole input (planner/cost/layers.py LayerCost.recompute_peak_bytes). Found by a Cohere built from a
config: stage 0 launched 65,536 B (one layer's input) over its prediction with a layer recomputed (§67.usertrial67)."""

import json

import pytest

from planner.cost import costmodel
from planner.models.synthetic import layer, profile_of

MIB = 2**20


def _costs(input_in_act: int | None):
    block = layer("b", "Block", fwd_ms=1.0, act_mib=3, input_mib=1, param_count=10)
    if input_in_act is not None:
        block = block.model_copy(update={"input_in_act_bytes": input_in_act})
    return costmodel.layer_costs(profile_of([block]))[0]


def test_the_recompute_peak_is_act_less_the_saved_part_of_the_input_by_hand():
    """act 3 MiB, input 1 MiB: saved with the input in act, the rerun makes 2 MiB beside the kept input; saving none
    of it, all 3 MiB; half of it, 2.5 MiB. The full option keeps the input (1 MiB) either way."""
    assert _costs(None).recompute_peak_bytes == 2 * MIB
    assert _costs(0).recompute_peak_bytes == 3 * MIB
    assert _costs(MIB // 2).recompute_peak_bytes == 5 * MIB // 2
    assert _costs(0).options[1].kept_bytes == MIB


@pytest.mark.slow
def test_a_cohere_first_stage_recomputing_a_layer_changes_its_peak_as_predicted(tmp_path):
    """In one process (validate's replay), stage 0 [embed, layers.0, layers.1] of a Cohere from a config, 1F1B, 2
    microbatches in flight: recomputing layers.0 in full lowers the measured peak by exactly what the prediction
    lowers it by (it lowered the prediction 65,536 B a microbatch more than the measured peak: one layer's input)."""
    pytest.importorskip("transformers")
    from fixtures.cli import run_ok

    from planner import io
    from planner.cost.assembly import with_predictions
    from planner.runtime import validate_plan
    from planner.schema import StagePlan

    config = tmp_path / "cohere.json"
    config.write_text(json.dumps(dict(model_type="cohere", hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=1024,
                                      max_position_embeddings=512, logit_scale=0.0625, tie_word_embeddings=True,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=0)))
    profile_path, plan_path = tmp_path / "profile.json", tmp_path / "plan.yaml"
    run_ok("profile", "--hf-config", config, "--seq-len", "64", "--micro-batch-size", "2", "--threads", "1",
           "--repeats", "1", "--warmup", "1", "--out", profile_path)
    run_ok("solve", "--profile", profile_path, "--stages", "2", "--mem", "1GiB", "--microbatches", "4",
           "--out", plan_path)
    solved, profile = io.load_plan(plan_path), io.load_profile(profile_path)
    names = [item.name for item in profile.layers]
    peaks = []
    for recompute in ({}, {"layers.0": "full"}):
        ranks = [StagePlan(index=0, layers=names[:3], recompute=recompute), StagePlan(index=1, layers=names[3:])]
        plan = solved.model_copy(update={"stages": with_predictions(ranks, costmodel.evaluate(ranks, profile,
                                                                                             solved.setup))})
        io.save_plan(plan, plan_path)
        check, = validate_plan(io.load_plan(plan_path), plan_file=plan_path, stage=0, device="cpu", seed=0)
        peaks.append((check.predicted_peak_bytes, check.peak_bytes))
    (predicted_none, measured_none), (predicted_full, measured_full) = peaks
    assert predicted_none - predicted_full == measured_none - measured_full
