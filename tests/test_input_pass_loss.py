"""The last stage's split input pass keeps what the loss saved through the loss's backward (torch's
stage_backward_input: retain_graph=True, the loss detached at the pass's end), where a full backward frees each
saved tensor as its node runs (planner/cost/loss_records.py input_pass_retained_bytes; docs/framework-facts.md §856).
Found by a ZBV plan of an OLMo 2 built from a config: rank 0 (the loss's) 4 B over its prediction (§67.usertrial67)."""

import json

import pytest

from planner.cost import costmodel, loss_records
from planner.models.synthetic import layer, profile_of
from planner.schema import AllocRecord, TrainSetup

S = 8 * 2**20  # the logits' bytes: the loss's backward the stage's input-pass peak, above a layer's 1 MiB
# cross-entropy as the profiler records it (the OLMo 2's, with 524,288 B logits): forward log-softmax (id 1), the
# value (id 2, the output), a 4 B scalar it saves (id 3); backward the seed (id 4), a gradient (5), frees id 3, the
# logits' gradient (6, handed back), frees 5, 1 and the seed
CROSS_ENTROPY = AllocRecord(forward=[S, 4, 4], backward=[4, S, -3, S, -5, -1, -4], output=2, input_grad=6)


def _setup(schedule: str = "ZBV", chunks: int = 2) -> TrainSetup:
    return TrainSetup(stages=2, microbatches=4, micro_batch_size=1, schedule=schedule, chunks=chunks,
                      mem_caps_bytes=[2**40] * 2)


def _profile(record: AllocRecord | None):
    profile = profile_of([layer(f"l{i}", "Block", fwd_ms=1.0, act_mib=1, input_mib=1, param_count=1000)
                          for i in range(4)])
    return profile.model_copy(update={"loss_bytes": S + 8, "loss_transient_bytes": 2 * S, "loss_alloc": record})


def test_the_saved_scalar_stays_through_the_input_pass_by_hand():
    """Full backward: 4 + S - 4 (id 3 freed) + S = 2 S over what the loss keeps; retained: id 3 stays, 2 S + 4:
    4 B more. A loss that frees nothing it saved before its peak, or no record: 0."""
    assert loss_records.input_pass_retained_bytes(_profile(CROSS_ENTROPY), _setup()) == 4
    late = AllocRecord(forward=[S, 4], backward=[4, S, -1, -3], output=2, input_grad=4)
    assert loss_records.input_pass_retained_bytes(_profile(late), _setup()) == 0
    assert loss_records.input_pass_retained_bytes(_profile(None), _setup()) == 0


def test_the_last_stages_input_pass_peak_carries_it_and_no_other_stage():
    """The stages' sums: the last stage's input-pass peak is the loss's transient (2 S) + 4 B, the loss's backward
    its peak; without the record 2 S; a middle stage's the same with and without."""
    profile, setup = _profile(CROSS_ENTROPY), _setup()
    view = costmodel.stages_view(setup, costmodel.schedule_of(setup))
    costs = costmodel.layer_costs(profile)
    last = costmodel.stage_sums([costs[3]], [0], stage=3, profile=profile, setup=view)
    middle = costmodel.stage_sums([costs[2]], [0], stage=2, profile=profile, setup=view)
    plain = costmodel.stage_sums([costs[3]], [0], stage=3, profile=_profile(None), setup=view)
    assert (last.input_pass_peak_bytes, plain.input_pass_peak_bytes) == (2 * S + 4, 2 * S)
    assert middle.input_pass_peak_bytes == costmodel.stage_sums([costs[2]], [0], stage=2, profile=_profile(None),
                                                                setup=view).input_pass_peak_bytes


@pytest.mark.slow
def test_an_olmo2_zbv_rank_holding_the_loss_runs_at_its_predicted_peak(tmp_path):
    """The user's plan (§67.usertrial67), fixed by hand so no timing picks it: an OLMo 2 of 6 layers from a config,
    ZBV on 2 ranks, rank 0 [embed, layers.0-3] + [head] with layers.0-3 recomputed in full, its peak at the head's
    input pass. Measured 20,819,152 B where 20,819,148 was predicted; now exact, and never under on either rank."""
    pytest.importorskip("transformers")
    from fixtures.cli import run_ok

    from planner import io
    from planner.cost.assembly import with_predictions
    from planner.runtime.launcher import run_plan
    from planner.schema import StagePlan

    config = tmp_path / "olmo2.json"
    config.write_text(json.dumps(dict(model_type="olmo2", hidden_size=128, intermediate_size=344, num_hidden_layers=6,
                                      num_attention_heads=4, num_key_value_heads=4, vocab_size=1024,
                                      max_position_embeddings=512, tie_word_embeddings=False, pad_token_id=1,
                                      eos_token_id=2, bos_token_id=None)))
    profile_path, plan_path = tmp_path / "profile.json", tmp_path / "plan.yaml"
    run_ok("profile", "--hf-config", config, "--seq-len", "64", "--micro-batch-size", "2", "--threads", "1",
           "--repeats", "1", "--warmup", "1", "--out", profile_path)
    run_ok("solve", "--profile", profile_path, "--stages", "2", "--schedule", "ZBV", "--mem", "1GiB",
           "--microbatches", "4", "--out", plan_path)
    solved, profile = io.load_plan(plan_path), io.load_profile(profile_path)
    full = {f"layers.{i}": "full" for i in range(4)}
    ranks = [StagePlan(index=0, layers=["embed", *full, "head"], chunks=[["embed", *full], ["head"]], recompute=full),
             StagePlan(index=1, layers=["layers.4", "layers.5"], chunks=[["layers.4"], ["layers.5"]])]
    cost = costmodel.evaluate(ranks, profile, solved.setup)
    plan = solved.model_copy(update={"stages": with_predictions(ranks, cost)})
    io.save_plan(plan, plan_path)
    report = run_plan(io.load_plan(plan_path), plan_file=plan_path, steps=1, warmup_steps=1)
    over = [stage.predicted.peak_bytes - stage.measured.peak_bytes for stage in report.stages]
    assert over[0] == 0 and 0 <= over[1] <= 64, over
