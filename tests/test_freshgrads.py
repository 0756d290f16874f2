"""A layer's fresh weight gradients (the profile's weight_grad_transient_bytes) charged as each runtime holds
them: taken off the transient where the record says the GEMM accumulates them (Megatron-LM's
gradient_accumulation_fusion), kept under eager autograd, kept for a lookup table's gradient (no GEMM)."""

import pytest

from planner.cost import costmodel, freshgrads, runtimes, terms
from planner.models.synthetic import layer, profile_of
from planner.schema import TrainSetup
from planner.solve import search

MIB = 2**20
FRESH = 10 * MIB  # of each block's 24 MiB transient, its weight gradients made fresh


def _profile(fresh: int = FRESH, transient_mib: float = 24):
    layers = [layer("embed", "Embedding", fwd_ms=0.5, act_mib=0.1, input_mib=0.01, output_mib=8, param_count=4096,
                    transient_mib=16).model_copy(update={"weight_grad_transient_bytes": 2 * MIB,
                                                         "lookup_param_count": 4096})]
    layers += [layer(f"blocks.{i}", "Block", fwd_ms=10, act_mib=136, input_mib=8, param_count=12_600,
                     transient_mib=transient_mib).model_copy(update={"weight_grad_transient_bytes": fresh})
               for i in range(4)]
    layers.append(layer("head", "Head", fwd_ms=12, act_mib=40, input_mib=8, output_mib=8, param_count=4096))
    return profile_of(layers)


def _setup(runtime: str, caps=(2**50, 2**50), **training) -> TrainSetup:
    return TrainSetup(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=list(caps),
                      precision="bf16-mixed", runtime=runtime, **training)


def _extra(profile, setup, name):
    item = next(item for item in costmodel.layer_costs(profile) if item.name == name)
    return terms.layer_value("extra", item, 0, terms.Context(profile, setup))


def test_the_records_say_who_accumulates_inside_the_gemm():
    assert runtimes.of(_setup("megatron").training).wgrad_in_gemm
    assert not any(runtimes.of(_setup(name).training).wgrad_in_gemm
                   for name in ("ckplan", "torchtitan", "deepspeed", "colossalai"))


def test_a_block_under_the_fusion_holds_its_transient_less_its_fresh_gradients_by_hand():
    profile = _profile()
    assert _extra(profile, _setup("megatron"), "blocks.0") == 24 * MIB - FRESH  # 14 MiB
    assert _extra(profile, _setup("ckplan"), "blocks.0") == 24 * MIB  # eager: made, held to the add
    assert _extra(profile, _setup("megatron", unfused_grad_accumulation=True), "blocks.0") == 24 * MIB
    # the table's gradient is the lookup's (embedding_dense_backward), no GEMM: fresh under every runtime
    assert _extra(profile, _setup("megatron"), "embed") == 16 * MIB


def test_a_measured_profile_none_is_kept_as_measured():
    profile = _profile(fresh=None)
    item = next(item for item in costmodel.layer_costs(profile) if item.name == "blocks.0")
    assert item.weight_grad_transient_bytes == 0
    assert freshgrads.fused_back(item, _setup("megatron")) == 0


def test_evaluate_charges_the_fused_block_as_a_profile_without_the_fresh_gradients():
    """Under the fusion a block of 24 MiB with 10 fresh costs what a block of 14 with none does, to the byte;
    under eager autograd, what a block of 24 with none does."""
    stages = costmodel.split_to_stages([0, 3], [0] * 6, _profile())
    fused = costmodel.evaluate(stages, _profile(), _setup("megatron")).peak_bytes_per_stage
    assert fused == costmodel.evaluate(stages, _profile(0, 14), _setup("megatron")).peak_bytes_per_stage
    eager = costmodel.evaluate(stages, _profile(), _setup("ckplan")).peak_bytes_per_stage
    assert eager == costmodel.evaluate(stages, _profile(0, 24), _setup("ckplan")).peak_bytes_per_stage
    assert max(eager) > max(costmodel.evaluate(stages, _profile(0, 14), _setup("ckplan")).peak_bytes_per_stage)


@pytest.mark.parametrize("solver", ["dp", "milp"])
def test_the_solvers_read_the_same_figure_as_evaluate(solver):
    """Caps between the fused and the eager peak of the plain split: evaluate, the DP and the MILP agree."""
    profile = _profile()
    plain = costmodel.split_to_stages([0, 3], [0] * 6, profile)
    fused = costmodel.evaluate(plain, profile, _setup("megatron")).peak_bytes_per_stage
    caps = [p + costmodel.FIT_MARGIN_BYTES + MIB for p in fused]
    setup = _setup("megatron", caps)
    result = search.plan(profile, setup, solver=solver, mip_gap=0.0, threads=1)
    assert isinstance(result, search.PlanResult)
    again = costmodel.evaluate(result.stages, profile, setup)
    assert again.feasible and result.cost.iteration_ms == pytest.approx(again.iteration_ms, rel=1e-9)
    assert result.cost.peak_bytes_per_stage == again.peak_bytes_per_stage


def test_the_analytic_embedding_holds_its_tables_gradient_beside_the_outputs_by_hand():
    """tiny-ep: vocab 256, hidden 64, bf16, 2 x 16 tokens; under TP 2 a rank's table is 128 rows."""
    from planner.models import archs
    from planner.profiler import analytic
    from planner.profiler.analytic import Shape

    tiny = archs.Arch(name="tiny", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4, num_kv_heads=2,
                      vocab_size=256, tie_word_embeddings=False)
    for tp, rows in ((1, 256), (2, 128)):
        shape = Shape(seq_len=16, micro_batch_size=2, tp=tp)
        embed = analytic.embedding_layer(tiny, shape, archs.GPUS["h100-sxm"])
        table = rows * 64 * 2
        assert embed.weight_grad_transient_bytes == table
        assert embed.transient_bytes == embed.output_bytes + table == 2 * 16 * 64 * 2 + table
