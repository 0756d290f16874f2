"""Transformer Engine's FP8 delayed scaling (planner/cost/te_delayed.py, planner/profiler/te_delayed.py; Megatron-LM's
--fp8-recipe delayed and its settings; docs/framework-facts.md §235-§242): the reader's every flag, the meta buffers'
bytes by hand, the amax all-reduces' count, the casts' bytes, and the refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.cli import run

from planner.cost import stepcomm, te_delayed
from planner.cost.layers import LayerCost
from planner.errors import UserError
from planner.models.archs import gpu
from planner.profiler import float8
from planner.schema import TrainSetup

ROOT = Path(__file__).resolve().parents[1]
ROW = ROOT / "configs/megatron-lm/gpt3_345m_weekly_dgx_h100_1N8G_mcore_tp4_cp2_native_fp8_tp_sp_cp_tp_overlap.yaml"


def _read(tmp_path, flags: str):
    from planner.models.configs import megatron

    script = tmp_path / "train.sh"
    script.write_text("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 --hidden-size 64 "
                      "--num-attention-heads 4 --seq-length 32 --vocab-size 256 --bf16 " + flags + "\n")
    return megatron.read(script)


# ---------------------------------------------------------------- the reader


def test_the_recipe_given_or_by_default_is_delayed_scaling(tmp_path):
    given = _read(tmp_path, "--fp8-format hybrid --fp8-recipe delayed")
    status = {s.name: s.status for s in given.settings}
    assert status["--fp8-recipe"] == status["--fp8-format"] == "modelled"
    assert given.modelled.float8 and given.modelled.fp8_delayed_scaling and not given.modelled.fp8_current_scaling
    assert given.modelled.fp8_amax_history_len == 1 and not given.modelled.fp8_amax_tp_only  # Megatron's defaults
    default = _read(tmp_path, "--fp8-format e4m3")
    assert default.modelled.fp8_delayed_scaling and "--fp8-recipe" not in {s.name for s in default.settings}
    assert [note for note in default.notes if note.startswith("--fp8-recipe not given: Megatron-LM's default, delayed")]
    tensorwise = _read(tmp_path, "--fp8-format hybrid --fp8-recipe tensorwise --fp8-amax-history-len 16")
    assert tensorwise.modelled.fp8_current_scaling and not tensorwise.modelled.fp8_delayed_scaling
    # delayed scaling's settings mean nothing under current scaling: left for the reader's rest to list
    assert {s.name: s.status for s in tensorwise.settings}["--fp8-amax-history-len"] != "modelled"


def test_every_delayed_scaling_flag_is_read(tmp_path):
    job = _read(tmp_path, "--fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max "
                          "--fp8-margin 0 --fp8-interval 1 --tp-only-amax-red")
    status = {s.name: s.status for s in job.settings}
    for flag in ("--fp8-amax-history-len", "--fp8-amax-compute-algo", "--fp8-margin", "--fp8-interval",
                 "--tp-only-amax-red"):
        assert status[flag] == "modelled", flag
    assert job.modelled.fp8_amax_history_len == 1024 and job.modelled.fp8_amax_tp_only
    what = {s.name: s.what for s in job.settings}
    assert "numerics" in what["--fp8-amax-compute-algo"] and "numerics" in what["--fp8-margin"]
    assert "ignored by Transformer Engine since v1.8" in what["--fp8-interval"]


@pytest.mark.parametrize("flags, said", [
    ("--fp8-amax-compute-algo mean", "--fp8-amax-compute-algo 'mean' is not one of Megatron-LM's choices"),
    ("--fp8-amax-history-len 0", "--fp8-amax-history-len 0: give 1 or more"),
])
def test_bad_delayed_scaling_values_are_refused(tmp_path, flags, said):
    with pytest.raises(UserError, match=said):
        _read(tmp_path, "--fp8-format hybrid " + flags)


def test_the_row_reads_as_delayed_scaling_with_its_history():
    from planner.models.configs import megatron

    job = megatron.read(ROW)
    assert job.modelled.fp8_delayed_scaling and job.modelled.fp8_amax_history_len == 1024


# ---------------------------------------------------------------- the meta buffers by hand


def test_the_meta_buffers_by_hand():
    # a Linear (1 GEMM): forward scale 3 floats and history L x 3, backward scale 2 and history L x 2, each request
    # rounded up to 512 B; DotProductAttention (3 GEMMs): 9 and 6 quantizers
    assert te_delayed.meta_buffer_bytes([1], 1) == 4 * 512
    assert te_delayed.meta_buffer_bytes([3], 1) == 4 * 512
    assert te_delayed.meta_buffer_bytes([1], 1024) == 512 + 1024 * 3 * 4 + 512 + 1024 * 2 * 4  # 21,504
    assert te_delayed.meta_buffer_bytes([3], 1024) == 512 + 1024 * 9 * 4 + 512 + 1024 * 6 * 4  # 62,464
    assert te_delayed.meta_buffer_bytes([1, 3, 1, 1, 1], 1024) == 4 * 21_504 + 62_464 == 148_480
    assert te_delayed.meta_buffer_bytes([1], 100) == 512 + 1_536 + 512 + 1_024  # 1,200 and 800 B rounded up
    assert te_delayed.recompute_stash_bytes([1, 3], 1024) == (512 + 12_288) + (512 + 36_864)


def _layer(gemms=(1, 3, 1, 1, 1)) -> LayerCost:
    return LayerCost(name="layers.0", kind="decoder_block", fwd_ms=1.0, bwd_ms=2.0, act_bytes=100, input_bytes=10,
                     output_bytes=10, input_in_act_bytes=10, param_count=1, transient_bytes=0,
                     float8_module_gemms=gemms)


def _setup(*, tp=2, dp=4, delayed=True, current=False, **training) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=4, micro_batch_size=1, mem_caps_bytes=[80 << 30], runtime="megatron",
                      comm=dict(tp=tp, tp_gb_per_s=100.0, tp_step_latency_ms=3.4e-3), data_parallel=dict(dp=dp),
                      training=dict(float8=True, fp8_delayed_scaling=delayed, fp8_current_scaling=current, **training))


def test_the_static_and_kept_terms_by_option():
    training = _setup(fp8_amax_history_len=1024).training
    layer = _layer()
    assert te_delayed.static_bytes(layer, training, 0) == 148_480  # none: the buffers
    stash = 4 * (512 + 12_288) + (512 + 36_864)
    assert te_delayed.static_bytes(layer, training, 1) == 148_480 + stash  # full: the recompute's updated state too
    assert te_delayed.kept_bytes(layer, training, 0) == 0 and te_delayed.kept_bytes(layer, training, 1) == stash
    assert te_delayed.static_bytes(layer, _setup(delayed=False).training, 0) == 0
    assert te_delayed.static_bytes(_layer(()), training, 0) == 0  # a layer with no TE module


# ---------------------------------------------------------------- the amax all-reduces


class _Ctx:
    def __init__(self, setup, profile=None):
        self.setup, self.profile = setup, profile


def test_the_amax_group_and_one_all_reduce():
    assert te_delayed.amax_group(_setup(tp=2, dp=4)) == list(range(8))  # TP x DP (x CP: the setup's dp counts it)
    tp_only = _setup(tp=2, dp=4, fp8_amax_tp_only=True, context_parallel=2)
    assert te_delayed.amax_group(tp_only) == list(range(4))  # TP x CP
    setup = _setup(tp=2, dp=4)
    assert te_delayed.amax_reduce_ms(setup) == stepcomm.scalar_all_reduce(8, 1, setup)[2]
    # Ring / Simple forced: 8.4 + 2 x 7 x 3.4 µs
    forced = _setup(tp=2, dp=4, nccl_ring_simple=True)
    assert te_delayed.amax_reduce_ms(forced) == pytest.approx((8.4 + 14 * 3.4) / 1e3)
    assert te_delayed.amax_reduce_ms(_setup(tp=1, dp=1)) == 0.0  # a group of one rank reduces nothing


def test_the_amax_all_reduces_count_two_a_chunk_a_microbatch_and_one_a_recompute():
    from types import SimpleNamespace

    setup = _setup(tp=2, dp=4, nccl_ring_simple=True)
    one = te_delayed.amax_reduce_ms(setup)
    delayed_layer = SimpleNamespace(float8=SimpleNamespace(delayed=object()))
    ctx = _Ctx(setup, SimpleNamespace(layers=[delayed_layer], assumptions={"gpu": "a100-80g"}))  # no NVLS
    assert te_delayed.stage_amax_ms(0, ctx) == pytest.approx(2 * one)  # forward exit, backward end
    assert te_delayed.recompute_amax_ms(_layer(), 0, ctx) == 0.0
    assert te_delayed.recompute_amax_ms(_layer(), 1, ctx) == pytest.approx(one)  # the rerun's autocast exit
    assert te_delayed.stage_amax_ms(0, _Ctx(_setup(delayed=False, current=True), ctx.profile)) == 0.0
    bare = _Ctx(setup, SimpleNamespace(layers=[SimpleNamespace(float8=None)], assumptions={}))
    assert te_delayed.stage_amax_ms(0, bare) == 0.0  # no TE FP8 layer on the profile


def test_the_row_pays_the_all_reduces_and_holds_the_buffers():
    # the published row's job (12 dense TE blocks, 64 microbatches, one stage, TP 4 x CP 2 = an amax group of 8,
    # the functional tests' Ring / Simple): delayed against the same job under tensorwise current scaling
    from planner.commands import evaluate_config
    from planner.models.configs import megatron

    job = megatron.read(ROW)
    delayed = evaluate_config.predict(job, gpus=8, gpu_name="h100")
    one = (8.4 + 14 * 3.4) / 1e3
    assert te_delayed.amax_reduce_ms(delayed.setup, delayed.profile) == pytest.approx(one)
    static = delayed.cost.stages[0].static_bytes
    job = megatron.read(ROW)
    job.modelled.fp8_delayed_scaling, job.modelled.fp8_current_scaling = False, True
    current = evaluate_config.predict(job, gpus=8, gpu_name="h100")
    assert static - current.cost.stages[0].static_bytes == 12 * 148_480  # 12 blocks' buffers at 1,024 rows
    # the iteration against the same job charged as before (no recipe's terms): 64 microbatches x 2 reductions on
    # the one stage; the microbatches' casts move nothing here (each block-microbatch host-bound). b3peak: the step
    # casts the master shard into the FP8 weights under delayed scaling (--fp8-param-gather, the distributed
    # optimizer: te_master_cast_ms), 4 + 2 + 2 + 1 = 9 B a shard element and the Hopper transpose remade once
    # (1 + 1) x K 2 = 13 B at the fused 1.50415 TB/s, where the plain job's float8 all-gather precompute reads 4 B at
    # the HBM's 3.35 TB/s: 12 blocks x 786,432 FP8 parameters x (13 / 1.50415 - 4 / 3.35) ns / K 2 = 0.035147 ms
    job = megatron.read(ROW)
    job.modelled.fp8_delayed_scaling = False
    plain = evaluate_config.predict(job, gpus=8, gpu_name="h100")
    cast = 12 * 786_432 * (13 / 1.50415e12 - 4 / 3.35e12) * 1e3 / 2
    assert delayed.cost.iteration_ms - plain.cost.iteration_ms == pytest.approx(64 * 2 * one + cast, rel=1e-9)


def test_a_tiny_configs_buffers_through_evaluate(tmp_path):
    # two dense TE blocks at history 16: each 4 Linears x (512 + 512 + 512 + 512) + DotProductAttention's
    # (512 + 1,024 + 512 + 512: its forward history, 16 x 9 floats = 576 B, takes two 512 B blocks); the same job
    # under tensorwise holds none
    from planner.commands import evaluate_config

    flags = "--fp8-format hybrid --fp8-amax-history-len 16 --micro-batch-size 1 --global-batch-size 8"
    statics = []
    for recipe in ("delayed", "tensorwise"):
        job = _read(tmp_path, f"{flags} --fp8-recipe {recipe}")
        statics.append(evaluate_config.predict(job, gpus=8, gpu_name="h100").cost.stages[0].static_bytes)
    assert te_delayed.meta_buffer_bytes([1, 3, 1, 1, 1], 16) == 4 * 2048 + 2560
    assert statics[0] - statics[1] == 2 * (4 * 2048 + 2560)


# ---------------------------------------------------------------- the casts


def test_the_casts_bytes_by_hand():
    h100, b200 = gpu("h100-sxm"), gpu("b200")
    plain = float8.Linear("layers.0.self_attention.linear_proj", 8, 16, 32, 16, 32)
    normed = float8.Linear("layers.0.self_attention.linear_qkv", 8, 16, 48, 16, 48)
    # a Linear's input: the cast (2 read + 1 written) and, on Hopper, its transpose (1); tensorwise 5 (+1)
    assert float8.te_input_bytes(plain, b200, delayed=True) == 3 * 8 * 16
    assert float8.te_input_bytes(plain, h100, delayed=True) == 4 * 8 * 16
    assert float8.te_input_bytes(plain, h100) == 6 * 8 * 16
    # a LayerNormLinear's: the norm writes FP8 (1 B where the bf16 block's wrote 2) and, on Hopper, nvte_transpose
    # reads it and writes the transpose (2); tensorwise 3 (+1)
    assert float8.te_input_bytes(normed, b200, delayed=True) == -1 * 8 * 16
    assert float8.te_input_bytes(normed, h100, delayed=True) == 1 * 8 * 16
    assert float8.te_input_bytes(normed, h100, columnwise=False, delayed=True) == -1 * 8 * 16
    assert float8.te_grad_bytes(plain, h100, delayed=True) == 4 * 8 * 32
    assert float8.weight_cast_bytes(10, delayed=True) == 30 and float8.weight_cast_bytes(10) == 50


def test_the_profile_records_delayed_beside_tensorwise():
    from planner.commands import evaluate_config
    from planner.models.configs import megatron

    profile = evaluate_config.predict(megatron.read(ROW), gpus=8, gpu_name="h100").profile
    block = next(layer for layer in profile.layers if layer.kind == "decoder_block")
    assert block.float8.delayed.module_gemms == [1, 3, 1, 1, 1]
    assert block.float8.delayed.bwd_ms <= block.float8.bwd_ms + 1e-12  # its swapped passes: no amax pass


# ---------------------------------------------------------------- the refusals


def test_the_settings_are_refused_where_they_mean_nothing(tmp_path):
    from fixtures.tiny_gpt2 import tiny_gpt2_profile

    path = tiny_gpt2_profile(tmp_path, "h100")
    base = ["evaluate", "--profile", path, "--layers-per-stage", "4", "--ckpt-per-stage", "0", "--microbatches", "3",
            "--mem", "80GB", "--precision", "bf16-mixed", "--runtime", "megatron"]
    for extra, said in ((["--fp8-delayed-scaling"], "--fp8-delayed-scaling is Transformer Engine's FP8 recipe under "
                                                   "--runtime megatron with --float8"),
                        (["--float8", "--fp8-delayed-scaling", "--fp8-current-scaling"], "two FP8 recipes"),
                        (["--float8", "--fp8-amax-history-len", "8"], "--fp8-amax-history-len sets Transformer "
                                                                       "Engine's delayed scaling"),
                        (["--float8", "--fp8-tp-only-amax-red"], "--fp8-tp-only-amax-red sets")):
        result = run(*base, *extra)
        assert result.exit_code != 0 and said in result.output, result.output


def test_torchtitans_delayed_scaling_is_refused_and_dynamic_modelled(tmp_path):
    from planner.models.configs import torchtitan

    def toml(extra: str) -> Path:
        path = tmp_path / "old.toml"
        path.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nbatch_size = 1\nseq_len = 1024\n'
                        '[float8]\nenable_float8_linear = true\n' + extra)
        return path

    with pytest.raises(UserError, match="float8.scaling_type_input = 'delayed': torchao's delayed scaling"):
        torchtitan.read(toml('scaling_type_input = "delayed"\n'))
    job = torchtitan.read(toml('scaling_type_weight = "dynamic"\n'))
    assert job.modelled.float8 and {s.name: s.status for s in job.settings}["float8.scaling_type_weight"] == "modelled"


def test_the_megatron_export_says_the_recipe_it_was_scored_with():
    from planner.emit.scored_as import megatron_fp8_unwritten

    said = megatron_fp8_unwritten(_setup(fp8_amax_history_len=1024, fp8_amax_tp_only=True).training)
    assert said == ["FP8 (scored with --float8): not written here; give --fp8-format hybrid --fp8-recipe delayed "
                    "(scored with --fp8-delayed-scaling) --fp8-amax-history-len 1024 --tp-only-amax-red."]
    assert "--fp8-recipe tensorwise (scored with --fp8-current-scaling)" in \
        megatron_fp8_unwritten(_setup(delayed=False, current=True).training)[0]
    assert megatron_fp8_unwritten(_setup(delayed=False).training.model_copy(update={"float8": False})) == []
