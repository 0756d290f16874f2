"""FSDP2's units (planner/cost/fsdpunits.py) and the buffer term charged per moment from them,
against bytes counted by hand on a four-layer model: embedding E = 8 Mi parameters, two blocks of
B = 2 Mi, a head (norm + output) H = 8 Mi. bf16-mixed under torchtitan: gathered weights and the
unsharded gradient 2 B a parameter, the reduce-scatter input in the reduce dtype, fp32, 4 B."""

from __future__ import annotations

import pytest

from planner.cost import costmodel, dataparallel, fsdpunits, gathered
from planner.models.synthetic import layer, profile_of
from planner.schema import TrainSetup

MI = 2**20
PARAMS = [8 * MI, 2 * MI, 2 * MI, 8 * MI]
NO_FP8 = [0, 0, 0, 0]
ROOT = dict(grouping="root-ends", held=("first", "before-last"))  # torchtitan 9dec370, bbb1b616
SPLIT = dict(grouping="per-layer", held=("last",))  # torchtitan 2c8b5947, b5bcd76c


def setup(**fields) -> TrainSetup:
    base = dict(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**50], precision="bf16-mixed",
                runtime="torchtitan", runtime_version="9dec370", dp=4, zero=3)
    return TrainSetup(**(base | fields))


def test_units_group_the_ends_into_the_root_or_keep_every_layer_apart():
    assert fsdpunits.unit_of_layers(4, "root-ends") == [0, 1, 2, 0]
    assert fsdpunits.unit_of_layers(4, "per-layer") == [0, 1, 2, 3]
    assert fsdpunits.gathered_from_forward([0, 1, 2, 0], ROOT["held"]) == {0, 2}
    assert fsdpunits.gathered_from_forward([0, 1, 2, 3], SPLIT["held"]) == {3}


def test_the_root_and_the_last_block_are_gathered_at_the_loss_under_9dec370():
    # (E + H) x 2 B for the root, B x 2 B for the last block: 36 Mi
    assert fsdpunits.loss_moment_bytes(PARAMS, NO_FP8, setup(), **ROOT) == 36 * MI
    # 2c8b5947: [norm, output] alone, H x 2 B
    assert fsdpunits.loss_moment_bytes(PARAMS, NO_FP8, setup(), **SPLIT) == 16 * MI


@pytest.mark.parametrize("i, computing, own, after", [
    # the head: the root gathered (32), the last block held (4); by the end of its backward the head's
    # gradient (16); the root reduces at the end of the backward: no reduce-scatter input yet, no post-backward here
    (3, 32 + 4, 16, 0),
    # the last block: itself and the root (32 + 4), block 0 prefetched (4); the head's gradient (16), then
    # its own (4); nothing reduced before it. Post-backward: itself resharded, its own reduce-scatter input
    # (2 Mi x 4 B = 8)
    (2, 32 + 4 + 4 + 16, 4, 32 + 4 + 4 + 16 + 8),
    # block 0: itself and the root (36), block 1 resharded; the head's gradient (16), then its own (4); block
    # 1's reduce-scatter input (8). Post-backward: the root (32), the gradients, its own input (8)
    (1, 36 + 16 + 8, 4, 32 + 20 + 8),
    # the embedding: the root (32); the head's gradient (16), then its own (16); block 0's input (8).
    # Post-backward: the root resharded, the gradients, the root's input (16 Mi x 4 B)
    (0, 32 + 16 + 8, 16, 32 + 64),
])
def test_each_layers_backward_under_the_root_unit(i, computing, own, after):
    assert fsdpunits.layer_moment_bytes(PARAMS, NO_FP8, i, setup(), **ROOT) == \
        ((computing) * MI, (computing + own) * MI, after * MI)


@pytest.mark.parametrize("i, computing, own, after", [
    # [norm, output] and the prefetched last block, then its gradient; post-backward: the last block, its
    # gradient, its input (8 Mi x 4 B)
    (3, 2 * (8 + 2), 16, 2 * 2 + 16 + 32),
    # block 0 and the embedding prefetched, block 1's input, then its gradient; post-backward: the
    # embedding, its gradient, its own input
    (1, 2 * (2 + 8) + 8, 4, 2 * 8 + 4 + 8),
])
def test_each_layers_backward_with_the_head_apart(i, computing, own, after):
    assert fsdpunits.layer_moment_bytes(PARAMS, NO_FP8, i, setup(runtime_version="2c8b5947"), **SPLIT) == \
        (computing * MI, (computing + own) * MI, after * MI)


def test_on_equal_layers_a_moment_is_the_measured_largest_layer_term():
    # every layer its own unit, none held: two gathered, a gradient, a reduce-scatter input
    equal = [MI] * 4
    s = setup()
    start, end, after = fsdpunits.layer_moment_bytes(equal, NO_FP8, 2, s, grouping="per-layer", held=())
    assert end == dataparallel.unsharded_bytes(MI, s) == (2 * 2 + 2 + 4) * MI
    assert start == end - 2 * MI  # none of its gradient at the start of its backward
    assert after == (2 + 2 + 4) * MI  # its own weights resharded before its reduce-scatter


def test_float8_weights_gather_at_one_byte():
    # the root's 16 Mi with 8 Mi Float8 weights (the embedding's, for the count): 8 x 2 + 8 x 1, + the last block's 4
    s = setup(float8=True, fp8_all_gather=True)
    assert fsdpunits.loss_moment_bytes(PARAMS, [8 * MI, 0, 0, 0], s, **ROOT) == (16 + 8 + 4) * MI


def four_layers():
    layers = [layer("tok_embeddings", "embedding", fwd_ms=1, act_mib=0, input_mib=0, param_count=PARAMS[0]),
              layer("layers.0", "decoder_block", fwd_ms=1, act_mib=0, input_mib=0, param_count=PARAMS[1]),
              layer("layers.1", "decoder_block", fwd_ms=1, act_mib=0, input_mib=0, param_count=PARAMS[2]),
              layer("output", "norm+lm_head", fwd_ms=1, act_mib=0, input_mib=0, param_count=PARAMS[3])]
    return profile_of(layers, name="four_units")


def test_rules_charge_the_units_per_moment_and_the_largest_layer_elsewhere():
    p = four_layers()
    titan = setup()
    assert gathered.unsharded_bytes(p, 0, titan) == 0
    assert gathered.fsdp_unit_loss_bytes(p, 0, titan) == 36 * MI
    # the largest of each layer's moments (the layers have no scratch, nothing kept): block 0's is its copy-out,
    # the root gathered (32) with its all-gather output still referenced (32), block 0's output and weights (4 + 4)
    assert [costmodel.unit_layer_bytes(x, 0, p, titan) for x in costmodel.layer_costs(p)] == \
        [96 * MI, 72 * MI, 64 * MI, 52 * MI]
    # ckplan's runtime on one stage: every layer its own unit, none held; bf16 gradients (2 B) reduced in bf16.
    # The embedding's end: itself (16), block 0's reduce-scatter input (2 Mi x 2 B), its gradient (16)
    ours = setup(runtime="ckplan", runtime_version=None)
    assert gathered.unsharded_bytes(p, 0, ours) == 0
    assert gathered.fsdp_unit_loss_bytes(p, 0, ours) == 0
    assert costmodel.unit_layer_bytes(costmodel.layer_costs(p)[0], 0, p, ours) == (16 + 4 + 16) * MI
    # beside a 1F1B pipeline its stage reduces every microbatch (§399): per moment too, no term held. The solvers'
    # bound, the split unknown: the embedding's end holds itself (16), block 0's reduce-scatter input as if reduced
    # before it in its stage (4), its gradient (16) and the largest all-gather output a stage's first unit may
    # prefetch after two forwards (the embedding's or the head's, 16: §400); on the CPU (gloo) also its own all-gather
    # output, which gloo's work may still hold where the embedding is its stage's only unit (16: gloowork.py), and
    # its table's gradient foreach_reduce keeps past the reduce-scatter (16: the profile records no last tensor, so
    # the layer's parameters bound it, §896; before, none charged)
    piped = setup(runtime="ckplan", runtime_version=None, stages=2, microbatches=2, mem_caps_bytes=[2**50] * 2)
    assert gathered.unsharded_bytes(p, 0, piped) == 0
    gpu = p.model_copy(update={"device": p.device.model_copy(update={"type": "cuda"})})
    assert costmodel.unit_layer_bytes(costmodel.layer_costs(gpu)[0], 0, gpu, piped) == (16 + 4 + 16 + 16) * MI
    assert costmodel.unit_layer_bytes(costmodel.layer_costs(p)[0], 0, p, piped) == (16 + 4 + 16 + 16 + 16 + 16) * MI
    # torchtitan's root unit spans the model's ends: beside a pipeline the largest layer's term stays
    titan_piped = setup(stages=2, microbatches=2, mem_caps_bytes=[2**50] * 2)
    assert gathered.unsharded_bytes(p, 0, titan_piped) > 0


def test_weights_kept_whole_beside_a_pipeline_are_not_charged_again():
    # every unit stays gathered beside a pipeline, already whole bf16 weights in static
    p = four_layers()
    whole = setup(zero_gather="per-iteration")
    assert gathered.unsharded_bytes(p, 0, whole) == 0
    assert gathered.fsdp_unit_loss_bytes(p, 0, whole) == 0
    assert all(costmodel.unit_layer_bytes(x, 0, p, whole) == 0 for x in costmodel.layer_costs(p))


def test_the_stage_peaks_at_the_largest_moment():
    # no activations: the stage's transient is the largest moment, the root's post-backward (96 Mi);
    # nothing of FSDP2's is held all iteration
    p = four_layers()
    stages = costmodel.evaluate([costmodel.StagePlan(index=0, layers=[x.name for x in p.layers])], p, setup())
    assert stages.stages[0].transient_bytes == 96 * MI


@pytest.mark.parametrize("version", ["9dec370", "2c8b5947"])
def test_both_solvers_and_evaluate_agree_with_the_units_charged_per_moment(version):
    # a cap halfway between no recompute and full: the layers' options meet the units' moments
    from export_plans import llm_profile

    from planner.solve import search
    p = llm_profile(8)
    n = len(p.layers)
    base = setup(runtime_version=version, microbatches=2)
    peaks = [costmodel.evaluate(costmodel.split_to_stages([0], [ckpt] * n, p), p, base).stages[0].peak_bytes
             for ckpt in (False, True)]
    s = setup(runtime_version=version, microbatches=2, mem_caps_bytes=[sum(peaks) // 2])
    result = search.plan(p, s, time_limit_s=30)
    assert isinstance(result, search.PlanResult)  # re-scored by evaluate(): a mismatch raises
    again = costmodel.evaluate(result.stages, p, s)
    assert again.peak_bytes_per_stage == result.cost.peak_bytes_per_stage and again.feasible
    other = search.plan(p, s, time_limit_s=30, solver="milp", mip_gap=0.0)
    assert other.cost.iteration_ms == pytest.approx(result.cost.iteration_ms, rel=1e-6)


# ---------------------------------------------------------------- tied layers, ZeRO 2, the forward (torch 2.13)


def test_layers_sharing_a_parameter_are_one_unit_with_the_first_of_them():
    # FSDP2 refuses a parameter two groups manage: ckplan's runtime and torchtitan b5bcd76c join them
    assert fsdpunits.unit_of_layers(6, "per-layer", [[0, 5]]) == [0, 1, 2, 3, 4, 0]
    assert fsdpunits.unit_of_layers(4, "per-layer", [[1, 3]]) == [0, 1, 2, 1]
    assert fsdpunits.unit_of_layers(4, "root-ends", [[0, 3]]) == [0, 1, 2, 0]


# ckplan's runtime, fp32: weights, gradients and reduce-scatter inputs 4 B a parameter; the tied GPT's layers
# (embed 2,560 parameters, four blocks of 12,704, a head of 64 norm parameters beside the 2,048 it shares)
TIED_PARAMS = [2560, 12704, 12704, 12704, 12704, 64]
TIED = dict(grouping="per-layer", held=(), tied=[[0, 5]])


def ckplan(zero: int) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=2, micro_batch_size=2, mem_caps_bytes=[2**40], dp=2, zero=zero)


def test_a_tied_unit_stays_gathered_through_the_blocks_backward():
    # blocks.3 starts its backward with itself, blocks.2 prefetched and the [embed, head] unit gathered since
    # the head's backward (2,624 x 4), the head's norm gradient (64 x 4), no reduce-scatter input yet (the
    # tied unit reduces after the embedding): 112,384 B, the measured difference to ZeRO 0 at that moment
    start, end, after = fsdpunits.layer_moment_bytes(TIED_PARAMS, [0] * 6, 4, ckplan(3), **TIED)
    assert start == (12704 + 12704 + 2624) * 4 + 64 * 4 == 112_384
    assert end == start + 12704 * 4
    # post-backward: blocks.3 resharded, blocks.2 and the tied unit, its gradient and its own input
    assert after == (12704 + 2624) * 4 + 64 * 4 + 12704 * 4 + 12704 * 4


def test_zero_2_gathers_nothing_in_the_backward_and_keeps_the_forwards_outputs():
    # the weights whole from the forward (static): blocks.3's backward holds the head's gradient alone
    start, end, after = fsdpunits.layer_moment_bytes(TIED_PARAMS, [0] * 6, 4, ckplan(2), **TIED)
    assert (start, end, after) == (64 * 4, (64 + 12704) * 4, (64 + 12704 + 12704) * 4)
    # the head's forward: the tied unit gathered since the embedding's, so the last all-gather output kept is
    # blocks.3's (50,816 B, measured); untied, the head's copy-out runs with its own output and blocks.3's
    assert fsdpunits.forward_bytes(TIED_PARAMS, [0] * 6, 5, ckplan(2), **TIED) == (0.0, 12704 * 4)
    untied = [2560, 12704, 12704, 12704, 12704, 2112]
    copy_out, end = fsdpunits.forward_bytes(untied, [0] * 6, 5, ckplan(2), grouping="per-layer", held=())
    assert (copy_out, end) == ((2112 + 12704) * 4, 2112 * 4)
    # under ZeRO 3 the head's unsharded weights besides
    copy_out, end = fsdpunits.forward_bytes(untied, [0] * 6, 5, ckplan(3), grouping="per-layer", held=())
    assert (copy_out, end) == ((2 * 2112 + 12704) * 4, 2 * 2112 * 4)


def test_a_parameter_two_layers_share_is_gathered_once():
    from planner.schema import TiedSet

    layers = [layer("embed", "embedding", fwd_ms=1, act_mib=0, input_mib=0, param_count=2 * MI),
              layer("block", "decoder_block", fwd_ms=1, act_mib=0, input_mib=0, param_count=MI),
              layer("head", "norm+lm_head", fwd_ms=1, act_mib=0, input_mib=0, param_count=2 * MI)]
    p = profile_of(layers).model_copy(update={"tied": [TiedSet(layers=["embed", "head"], param_count=2 * MI,
                                                                param_bytes=8 * MI)]})
    costs = costmodel.layer_costs(p)
    # the embedding's end of backward, ZeRO 3 fp32: its unit (2 Mi, the head adding nothing) gathered, its
    # gradient (2 Mi), block's reduce-scatter input (1 Mi): 4 B each
    assert costmodel.unit_layer_bytes(costs[0], 0, p, ckplan(3)) == (2 + 2 + 1) * 4 * MI


def _stage_moment(p, s, names: list[str], stage: int, kept: float) -> list[float]:
    """Each of the stage's layers' largest moment as its stage runs it (gathered.stage_unit_moments), kept bytes
    `kept` a layer and no scratch (the largest moment less the solvers' bound, plus the bound)."""
    layers = [x for x in costmodel.layer_costs(p) if x.name in names]
    bounds = [gathered.fsdp_unit_layer_bytes(x, 0, p, s, lambda: kept) for x in layers]
    out = gathered.stage_unit_moments(layers, [0] * len(layers), [{"kept": kept, "extra": 0} for _ in layers],
                                      stage=stage, profile=p, setup=s, microbatch_kept=0)
    return [value["extra"] + bound for value, bound in zip(out, bounds)]


def test_a_stage_of_one_unit_prefetches_nothing_after_two_forwards():
    # [tok_embeddings] alone, 1F1B stage 0 of 2, M = 2 (two forwards, then the backwards): its pre-backward
    # prefetches itself, already unsharded (§435). Its post-backward in the first backward: its gradient (8 Mi x
    # 2 B = 16) and its reduce-scatter input (bf16, 16), its shard just made; no stray all-gather output (16 more,
    # 48 with it). On a GPU (NCCL) that is all; on the CPU (gloo, planner/cost/gloowork.py) the post-backward also
    # holds the reduce-scatter's output (8 Mi x 2 B / 4 = 4) beside gloo's clone, and the all-gather output of its
    # pre-backward (16), which gloo's work may still hold, and the table's unsharded gradient foreach_reduce keeps
    # past the wait (16; the profile records no last tensor, its parameters bound it: §896, before 52): 68
    p = four_layers()
    gpu = p.model_copy(update={"device": p.device.model_copy(update={"type": "cuda"})})
    piped = setup(runtime="ckplan", runtime_version=None, stages=2, microbatches=2, mem_caps_bytes=[2**50] * 2)
    assert _stage_moment(gpu, piped, ["tok_embeddings"], 0, kept=0) == [32 * MI]
    assert _stage_moment(p, piped, ["tok_embeddings"], 0, kept=0) == [(32 + 4 + 16 + 16) * MI]


def test_a_stages_first_unit_is_copied_out_beside_its_all_gather_output():
    # [layers.1, output], the last stage (one forward before each backward); layers.1 is its stage's first unit,
    # which nothing of its stage prefetches: its pre-backward copies its weights out (2 Mi x 2 B = 4) beside their
    # all-gather output (4) and the head's reduce-scatter input (8 Mi x 2 B = 16), its own kept bytes live and its
    # scratch not yet made: 24, where its backward's start is 20 (§436)
    p = four_layers()
    piped = setup(runtime="ckplan", runtime_version=None, stages=2, microbatches=2, mem_caps_bytes=[2**50] * 2)
    assert _stage_moment(p, piped, ["layers.1", "output"], 1, kept=MI)[0] == 24 * MI
