"""Float8 linears and FSDP2's float8 all-gather (planner/profiler/float8.py, planner/cost/float8.py,
the DP terms of planner/cost/dataparallel.py): hand counts of one linear's FP8 GEMMs and casts, which
linears torchtitan converts, the halved gather bytes, and the CLI's settings."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from planner.cli import cli
from planner.cost import dataparallel
from planner.cost.float8 import float8_profile, with_float8
from planner.errors import UserError
from planner.models import archs
from planner.profiler import analytic, float8
from planner.profiler.analytic import Shape
from planner.profiler.roofline import Kernel, kernel_ms, matmul_efficiency, work
from planner.schema import AllocRecord, FileRef, TrainSetup

H100 = archs.gpu("h100")
TINY = archs.Arch(name="tiny-llama", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                  num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=1024)
# wide enough that its GEMMs, not the casts, set a block's time (at 64 wide the casts cost more than
# float8 saves: torchao's README measures a float8 linear 0.80x the bf16 one at 1024 x 2048 x 1024)
# LLaMA 3 8B's widths: where float8's faster GEMMs outweigh its casts (their bytes at the measured rate of
# compiled kernels, planner/profiler/membound.py; at 2048 wide they no longer do)
MID = dataclasses.replace(TINY, name="mid-llama", hidden_size=4096, intermediate_size=14336, num_heads=32,
                          num_kv_heads=8, vocab_size=1024)
REF = FileRef(file="arch:test", sha256="0" * 64)
SHAPE = Shape(seq_len=1024, micro_batch_size=8)


def setup(**fields) -> TrainSetup:
    base = dict(stages=1, microbatches=1, micro_batch_size=8, mem_caps_bytes=[2**50], precision="bf16-mixed",
                runtime="torchtitan")
    return TrainSetup(**(base | fields))


# ---------------------------------------------------------------- one linear by hand


def test_one_float8_linear_by_hand():
    # 1,024 tokens x (in 2,048 -> out 512): 2 x 1,024 x 2,048 x 512 FLOPs a GEMM
    linear = float8.Linear("layers.0.attention.wo", tokens=1024, k=2048, n=512, full_k=2048, full_n=512)
    flops = 2 * 1024 * 2048 * 512
    bf16 = work(flops, 100, [Kernel("matmul", flops)])
    fwd, weights = float8.forward(bf16, [linear])
    # the GEMM in float8; the input's cast: amax read (2 B) + cast read (2) and write (1) per element
    assert fwd.kernels == ((Kernel("matmul-fp8", flops), 1),)
    assert fwd.bytes == 100 + 5 * 1024 * 2048 and fwd.flops == flops
    assert weights == 2048 * 512 and float8.weight_cast_bytes(weights) == 5 * 2048 * 512
    # backward: input-grad and weight-grad GEMMs in float8; grad_output cast once, the input again
    bwd = float8.backward(work(2 * flops, 0, [Kernel("matmul", flops)] * 2), [linear])
    assert bwd.kernels == ((Kernel("matmul-fp8", flops), 2),)
    assert bwd.bytes == 5 * 1024 * (512 + 2048)
    # each float8 GEMM at the FP8 peak (1,978.9 TFLOP/s dense) and its efficiency curve
    assert kernel_ms(Kernel("matmul-fp8", flops), H100) == pytest.approx(
        flops / (1978.9e12 * matmul_efficiency(flops, H100, fp8=True)) * 1e3, rel=1e-12)
    # the casts alive at the weight-grad GEMM: grad_output's and the input's float8 copies
    assert float8.cast_transient_bytes([linear]) == 1024 * (512 + 2048)


def test_a_rerun_without_the_last_gemm_converts_the_others_only():
    a = float8.Linear("x.w1", 16, 32, 48, 32, 48)
    b = float8.Linear("x.w2", 16, 48, 32, 48, 32)  # the same FLOPs as w1
    rerun = work(a.flops, 0, [Kernel("matmul", a.flops)])  # one of the two ran
    done, weights = float8.forward(rerun, [a, b])
    assert done.kernels == ((Kernel("matmul-fp8", a.flops), 1),)
    assert weights == 32 * 48 and done.bytes == 5 * 16 * 32


def test_a_block_casts_each_distinct_input_once_as_compiled():
    # TINY's block, 8 x 1,024 = 8,192 tokens: wq (64->64), wk, wv (64->32), wo (64->64), w1, w3 (64->160),
    # w2 (160->64). Compiled (AOTAutograd's CSE over the joint graph), the casts of one tensor with one
    # tensorwise scale are one: Q, K and V read attention_norm's output, w1 and w3 ffn_norm's
    T = 8 * 1024
    linears = float8.block_linears(TINY, SHAPE, "layers.0")
    assert [item.source for item in linears] == ["layers.0.attention_norm"] * 3 + [
        "layers.0.attention.wo", "layers.0.ffn_norm", "layers.0.ffn_norm",
        "layers.0.feed_forward.w2"]
    gemms = [Kernel("matmul", item.flops) for item in linears]
    fwd, weights = float8.forward(work(0, 0, gemms), linears)
    # inputs cast: the norm's output (64), wo's (64), ffn_norm's (64), w2's (160); not 3 x 64 + 64 + 2 x 64 + 160
    assert fwd.bytes == 5 * T * (64 + 64 + 64 + 160)
    assert weights == 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 160  # every weight is cast (not shared)
    # backward: every grad_output (64 + 32 + 32 + 64 + 160 + 160 + 64) and each distinct saved input again
    bwd = float8.backward(work(0, 0, gemms * 2), linears)
    assert bwd.bytes == 5 * T * ((64 + 32 + 32 + 64 + 160 + 160 + 64) + (64 + 64 + 64 + 160))
    # torchao eab345c saved the float8 input: the grad_outputs' casts alone
    saved = float8.backward(work(0, 0, gemms * 2), linears, saved_float8=True)
    assert saved.bytes == 5 * T * (64 + 32 + 32 + 64 + 160 + 160 + 64) and saved.kernels == bwd.kernels


def test_module_linears_name_the_tensor_their_input_is():
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wq, self.wk, self.wo = (torch.nn.Linear(16, 16, bias=False) for _ in range(3))

        def forward(self, x):
            return self.wo(self.wq(x) + self.wk(x))

    calls = float8.module_linears(Block(), torch.zeros(4, 16), "b")
    assert [call.source for call in calls] == ["b.wq", "b.wq", "b.wo"]  # wk reads wq's input: one cast


# ---------------------------------------------------------------- which linears torchtitan converts


def test_the_head_and_dims_off_16_stay_bf16():
    head = float8.Linear("output", 1024, 64, 128, 64, 128)
    odd = float8.Linear("layers.0.attention.wk", 1024, 64, 24, 64, 24)  # 24 is no multiple of 16
    kept = float8.Linear("layers.0.attention.wq", 1024, 64, 64, 64, 64)
    assert float8.converted([head, odd, kept]) == [kept]


def test_the_analytic_profile_records_every_block_linear_and_not_the_head():
    profile = analytic.analytic_profile(TINY, SHAPE, gpu=H100, model=REF)
    blocks = [layer for layer in profile.layers if layer.kind == "decoder_block"]
    assert [layer.float8 is not None for layer in profile.layers] == [False, True, True, False]
    # wq 64x64, wk and wv 64x32, wo 64x64, w1 and w3 64x160, w2 160x64: every block parameter
    assert blocks[0].float8.param_count == 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 160
    assert blocks[0].float8.param_count == blocks[0].param_count - 2 * 64  # all but the two norms
    assert set(blocks[0].float8.recompute_ms) == {"full", "op-sac"}
    assert blocks[0].float8.fwd_ms > blocks[0].fwd_ms  # 64 wide: the casts outweigh the faster GEMMs
    mid = analytic.analytic_profile(MID, SHAPE, gpu=H100, model=REF).layers[1]
    assert mid.float8.fwd_ms < mid.fwd_ms and mid.float8.bwd_ms < mid.bwd_ms
    # a GPU without FP8 tensor cores: no record
    a100 = analytic.analytic_profile(TINY, SHAPE, gpu=archs.gpu("a100-80g"), model=REF)
    assert all(layer.float8 is None for layer in a100.layers)


def test_the_op_sac_rerun_is_the_bf16_options_with_wk_wo_w3_in_float8_and_their_inputs_cast():
    """torchtitan's op-SAC reruns wk, wo and w3 and every memory-bound op of the forward
    (opsac.op_sac_option); under Float8 those three GEMMs run in float8 and their three distinct
    inputs (attention_norm's output, wo's input, ffn_norm's output) are cast again. MID's block at
    8,192 tokens: wk 4096 -> 1024, wo 4096 -> 4096, w3 4096 -> 14336."""
    from planner.profiler import analytic_time, opsac
    from planner.profiler.membound import membound_ms
    from planner.profiler.roofline import roofline_ms

    T, mi300x = 8 * 1024, archs.gpu("mi300x")
    passes = analytic_time.block_work(MID, SHAPE, moe=False)
    record = float8.block_record(MID, SHAPE, mi300x, passes, prefix="layers.0", op_sac=True)
    bf16 = opsac.op_sac_option(MID, SHAPE, mi300x, None, boundary=0, kept_without=0).recompute_ms
    gemms = [2 * T * 4096 * 1024, 2 * T * 4096 * 4096, 2 * T * 4096 * 14336]
    by_hand = (bf16 - sum(kernel_ms(Kernel("matmul", flops), mi300x) for flops in gemms)
               + sum(kernel_ms(Kernel("matmul-fp8", flops), mi300x) for flops in gemms)
               + membound_ms(5 * T * (4096 + 4096 + 4096), mi300x, "fused"))
    assert record.recompute_ms["op-sac"] == pytest.approx(by_hand, rel=1e-9)
    # it is the float8 GEMMs and casts plus the forward's memory-bound ops at their eager rates, as the bf16
    # option is: so a compiled block's saving on those ops (compiled_time) leaves the GEMMs' time, not nothing
    alone = roofline_ms(work(0, 5 * T * 3 * 4096, [Kernel("matmul-fp8", flops) for flops in gemms],
                             fused_bytes=5 * T * 3 * 4096), mi300x)
    forward_ops = roofline_ms(work(0, passes[0].bytes, [], classed=passes[0].classed), mi300x)
    assert record.recompute_ms["op-sac"] == pytest.approx(alone + forward_ops, rel=1e-9)
    # the weights it would cast (not under the float8 all-gather): wk's, wo's and w3's
    assert record.rerun_weight_cast_ms["op-sac"] == pytest.approx(
        membound_ms(5 * (4096 * 1024 + 4096 * 4096 + 4096 * 14336), mi300x, "fused"))


# ---------------------------------------------------------------- the float8 all-gather


def test_the_float8_all_gather_halves_the_converted_weights_bytes():
    params = 1_000_000
    dp = dict(dp=8, zero=3, shard_gb_per_s=100.0)
    plain, gathered = setup(**dp, float8=True), setup(**dp, float8=True, fp8_all_gather=True)
    assert dataparallel.param_bytes(plain).weights == 2  # bf16 gathered
    assert dataparallel.gathered_bytes(params, plain, fp8_count=params) == 2 * params
    assert dataparallel.gathered_bytes(params, gathered, fp8_count=params) == params
    assert dataparallel.gathered_bytes(params, gathered, fp8_count=params // 4) == 2 * params - params // 4
    assert dataparallel.weight_gather_ms(params, gathered, fp8_count=params) == \
        pytest.approx(dataparallel.weight_gather_ms(params, plain, fp8_count=params) / 2, rel=1e-12)
    # FSDP2's two gathered buffers of the largest layer: 1 B a converted weight
    assert dataparallel.unsharded_bytes(params, plain, fp8_count=params) - \
        dataparallel.unsharded_bytes(params, gathered, fp8_count=params) == 2 * params
    # beside a pipeline the gathered weights are kept whole: the float8 copy is 1 B, not 2
    whole = dict(dp=8, zero=3, zero_gather="per-iteration", stages=2, microbatches=2, mem_caps_bytes=[2**50] * 2)
    assert dataparallel.fp8_whole_saving_bytes(params, setup(**whole, float8=True, fp8_all_gather=True)) == params
    assert dataparallel.fp8_whole_saving_bytes(params, setup(**whole, float8=True)) == 0


# ---------------------------------------------------------------- the profile under the setting


def test_the_setting_charges_the_saved_float8_weight_unless_gathered_in_float8():
    profile = analytic.analytic_profile(TINY, SHAPE, gpu=H100, model=REF)
    block = profile.layers[1]
    alone = float8_profile(profile, setup(float8=True)).layers[1]
    assert alone.act_bytes == block.act_bytes + block.float8.param_count  # the float8 weight, 1 B each
    assert alone.recompute_options[1].kept_bytes == block.input_bytes  # checkpointed: its input alone
    assert alone.transient_bytes == block.transient_bytes + block.float8.transient_bytes
    assert alone.fwd_ms == pytest.approx(block.float8.fwd_ms + block.float8.weight_cast_ms)
    assert alone.bwd_ms == block.float8.bwd_ms
    gathered = float8_profile(profile, setup(float8=True, fp8_all_gather=True, dp=4, zero=3)).layers[1]
    assert gathered.act_bytes == block.act_bytes and gathered.fwd_ms == block.float8.fwd_ms
    # the scales precomputed once a step: every converted fp32 weight read (the step's /K is the cost model's)
    assert gathered.step_ms["adam"] == pytest.approx(block.step_ms["adam"] + block.float8.param_count * 4 / 3.35e12 * 1e3)
    assert float8_profile(profile, setup()) is profile  # the setting off: the profile as made


def test_torchtitan_9dec370s_torchao_saves_the_float8_input_and_recasts_none():
    profile = analytic.analytic_profile(MID, SHAPE, gpu=H100, model=REF)
    block = profile.layers[1]
    # the record's backward without the saved inputs' recast: 5 B a distinct input's element less,
    # at the fused kernels' rate (MID's block: attention_norm's, wo's, ffn_norm's and w2's inputs)
    recast = 5 * 8 * 1024 * (4096 + 4096 + 4096 + 14336)
    from planner.profiler.membound import membound_ms
    assert block.float8.bwd_input_recast_ms == pytest.approx(membound_ms(recast, H100, "fused"))
    old = float8_profile(profile, setup(float8=True, runtime_version="9dec370")).layers[1]
    new = float8_profile(profile, setup(float8=True)).layers[1]  # torchtitan's newest: torchao v0.11.0's rule
    assert (old.bwd_ms, new.bwd_ms) == (block.float8.bwd_ms - block.float8.bwd_input_recast_ms, block.float8.bwd_ms)
    # compiled, the record moves with the compiled backward (compiled_time.timed_layers) and the recast's
    # part stays: torchtitan 9dec370's compiled Float8 backward is the compiled one less the recast
    from planner.profiler import compiled_time
    compiled = analytic.analytic_profile(MID, SHAPE, gpu=H100, model=REF, compiled=True)
    timed, changed = compiled_time.timed_layers(compiled)
    assert changed == 2
    fp8 = timed.layers[1].float8
    assert float8_profile(timed, setup(float8=True, runtime_version="9dec370")).layers[1].bwd_ms == \
        pytest.approx(fp8.bwd_ms - fp8.bwd_input_recast_ms) and fp8.bwd_input_recast_ms > 0


def test_the_allocation_record_gains_the_float8_tensors():
    record = AllocRecord(forward=[10, 20, -1], backward=[5, -3, -2], output=2, input_grad=3)
    added = with_float8(record, kept=7, transient=4)
    # forward: the float8 weight made last (id 3); backward: the casts first (id 4), then the layer's
    # (its 5 now id 5), the frees renumbered, the casts and the weight freed last
    assert added.forward == [10, 20, -1, 7]
    assert added.backward == [4, 5, -5, -2, -4, -3]
    assert added.input_grad == 5 and added.output == 2


# ---------------------------------------------------------------- the command line


@pytest.fixture(scope="module")
def tiny_paths(tmp_path_factory):
    folder = tmp_path_factory.mktemp("p")
    paths = {}
    for name in ("h100", "a100-80g"):
        paths[name] = folder / f"{name}.json"
        paths[name].write_text(analytic.analytic_profile(MID, SHAPE, gpu=archs.gpu(name), model=REF).model_dump_json())
    return paths


def _evaluate(path, *extra):
    return CliRunner().invoke(cli, ["evaluate", "--profile", str(path), "--layers-per-stage", "4",
                                    "--ckpt-per-stage", "0", "--microbatches", "1", "--mem", "200GB",
                                    "--precision", "bf16-mixed", "--json", *extra])


def _hand(result) -> dict:
    assert result.exit_code == 0, result.output
    found, _ = json.JSONDecoder().raw_decode(result.output[result.output.index("{"):])
    return found["hand"]


def test_the_cli_models_float8_under_torchtitan(tiny_paths):
    plain = _hand(_evaluate(tiny_paths["h100"], "--runtime", "torchtitan"))
    fast = _hand(_evaluate(tiny_paths["h100"], "--runtime", "torchtitan", "--float8"))
    assert fast["iteration_ms"] < plain["iteration_ms"]
    assert fast["stages"][0]["peak_bytes"] >= plain["stages"][0]["peak_bytes"]  # the saved float8 weights
    gathered = _evaluate(tiny_paths["h100"], "--runtime", "torchtitan", "--float8", "--fp8-all-gather", "--dp", "2",
                         "--zero", "3")
    assert gathered.exit_code == 0, gathered.output
    # Megatron's Transformer Engine: timed, its saved inputs and weight copies as TE keeps them, said
    megatron = _evaluate(tiny_paths["h100"], "--runtime", "megatron", "--float8")
    assert _hand(megatron)["iteration_ms"] < _hand(_evaluate(tiny_paths["h100"], "--runtime", "megatron"))["iteration_ms"]
    assert "as Transformer Engine v2.9 saves them in FP8" in " ".join(megatron.output.split())


@pytest.mark.parametrize("path, flags, named", [
    ("h100", ["--float8"], "not modelled under --runtime ckplan"),
    ("h100", ["--runtime", "deepspeed", "--float8"], "not modelled under --runtime deepspeed"),
    ("h100", ["--runtime", "torchtitan", "--fp8-all-gather"], "give --float8 too"),
    ("h100", ["--runtime", "torchtitan", "--grad-reduce-in-bf16"], "--grad-reduce-in-bf16"),
    ("a100-80g", ["--runtime", "torchtitan", "--float8"], "FP8 tensor cores"),
])
def test_what_is_not_modelled_is_refused_in_one_sentence(tiny_paths, path, flags, named):
    result = _evaluate(tiny_paths[path], *flags)
    assert result.exit_code != 0
    assert named in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) <= 3


def test_an_analytic_moe_block_under_float8_is_refused_in_one_sentence():
    moe = dataclasses.replace(MID, name="mid-moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=512)
    profile = analytic.analytic_profile(moe, SHAPE, gpu=H100, model=REF)
    assert any(layer.float8 is not None for layer in profile.layers) is False
    dense_first = dataclasses.replace(moe, dense_layers=(0,))
    mixed = analytic.analytic_profile(dense_first, SHAPE, gpu=H100, model=REF)
    assert [layer.float8 is not None for layer in mixed.layers] == [False, True, False, False]
    with pytest.raises(UserError, match=r"--float8 on layers.1 \(moe_block\) is not modelled"):
        float8_profile(mixed, setup(float8=True))


# ---------------------------------------------------------------- the config readers


def _titan(**sections):
    from planner.models.configs import torchtitan

    base = {"model": {"name": "llama3", "flavor": "8B", "converters": ["float8"]},
            "training": {"seq_len": 4096, "local_batch_size": 1}}
    return torchtitan.from_mapping(base | sections, "t.toml")


@pytest.mark.parametrize("float8_keys, modelled", [
    ({"filter_fqns": ["output"], "enable_fsdp_float8_all_gather": True}, (True, True)),
    ({"filter_fqns": ["output"]}, (True, False)),
    ({}, (False, False)),  # today's filter_fqns defaults to []: the head converted, which ckplan does not
    ({"filter_fqns": ["output"], "recipe_name": "rowwise"}, (False, False)),
    ({"filter_fqns": ["output"], "force_recompute_fp8_weight_in_bwd": True}, (False, False)),
])
def test_torchtitan_float8_keys_map_to_the_settings_or_are_listed(float8_keys, modelled):
    job = _titan(quantize={"linear": {"float8": float8_keys}})
    assert (job.modelled.float8, job.modelled.fp8_all_gather) == modelled
    status = {s.name: s.status for s in job.settings}
    assert status["model.converters"] == ("modelled" if modelled[0] else "not modelled")


def _megatron_reader(tmp_path):
    """read(*flags): Megatron-LM's reader on a tiny launch script with those flags."""
    from planner.models.configs import megatron

    def read(*flags):
        script = tmp_path / "train.sh"
        script.write_text("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 --hidden-size 64 "
                          "--num-attention-heads 4 --seq-length 32 --vocab-size 256 --bf16 " + " ".join(flags) + "\n")
        return megatron.read(script)

    return read


def test_megatron_fp8_recipes_map_to_float8_or_are_listed(tmp_path):
    read = _megatron_reader(tmp_path)
    assert read("--fp8-format hybrid").modelled.float8  # delayed scaling, Megatron's default recipe
    assert read("--fp8-format hybrid --fp8-recipe tensorwise").modelled.float8
    blocked = read("--fp8-format hybrid --fp8-recipe mxfp8")
    assert not blocked.modelled.float8
    assert {s.name: s.status for s in blocked.settings}["--fp8-format"] == "not modelled"


def test_under_tp_with_sp_the_norms_output_is_cast_on_its_shard_and_saved_in_float8():
    # TINY at TP 2 with SP, 8,192 tokens: wq 64 -> 32, wk, wv 64 -> 16, wo 32 -> 64, w1, w3 64 -> 80, w2 80 -> 64
    T = 8 * 1024
    shape = Shape(seq_len=1024, micro_batch_size=8, tp=2, sp=True)
    linears = float8.block_linears(TINY, shape, "layers.0")
    gemms = [Kernel("matmul", item.flops) for item in linears]
    fwd, _ = float8.forward(work(0, 0, gemms), linears)
    # the two norms' outputs cast on the 4,096-row shard; wo's and w2's inputs whole
    assert fwd.bytes == 5 * (T // 2 * 64 * 2 + T * (32 + 80))
    bwd = float8.backward(work(0, 0, gemms * 2), linears)
    # the column-parallel grad_outputs whole (32 + 16 + 16 + 80 + 80); wo's and w2's (Float8RowwiseParallel)
    # on the 4,096-row shard before their all-gather (64 + 64); no saved input recast: every linear saved
    # its float8 input (the norms' gathered casts; wo's and w2's cast in the plan's _prepare_input_fn)
    assert bwd.bytes == 5 * (T * (32 + 16 + 16 + 80 + 80) + T // 2 * (64 + 64))
    assert [(item.saves_float8, item.grad_rows) for item in linears if item.fqn.endswith(("wo", "w2"))] == \
        [(True, T // 2)] * 2
    # at TP 1 (or without SP) no linear is under the Float8 TP plan: grad_outputs whole, inputs recast
    assert not any(item.saves_float8 or item.grad_rows for item in float8.block_linears(TINY, SHAPE, "layers.0"))


# ---------------------------------------------------------------- TE's FP8 weights under --fp8-param-gather


def _fp8_weights_case(gpu: str):
    from planner.models.membound_rate import achieved_tbps

    spec = archs.gpu(gpu)
    profile = analytic.analytic_profile(MID, SHAPE, gpu=spec, model=REF)
    block = profile.layers[1]
    return profile, block, block.float8.param_count, achieved_tbps(spec, "fused") * 1e12


@pytest.mark.parametrize("gpu, dp, transposed", [("h100", 4, True), ("h100", 1, True), ("b200", 4, False)])
@pytest.mark.parametrize("recipe, shard_bytes", [("fp8_current_scaling", 11), ("fp8_delayed_scaling", 9)])
def test_te_fp8_weights_are_cast_from_the_master_shard_once_a_step_and_transposed_once_on_hopper(
        gpu, dp, transposed, recipe, shard_bytes):
    # TE v2.9 `cast_master_weights_to_fp8` (framework-facts §639, §674): the fp32 master shard copied to bf16 (4 + 2 B,
    # utils.py 107); current scaling: the copy's amax (2 B) and its cast into the FP8 parameter (2 + 1 B), 11 B a
    # shard element; delayed scaling: the cast alone, its amax written as it casts (2 + 1 B), 9 B; on Hopper the next
    # forward's transpose of the whole local FP8 weight (1 + 1 B a local element), cached across microbatches
    from planner.cost import float8 as cost_float8

    profile, block, n, fused = _fp8_weights_case(gpu)
    te = dict(runtime="megatron", float8=True, dp=dp, zero=1) | {recipe: True}
    primary = setup(**te, fp8_all_gather=True)
    assert cost_float8.te_primary_weights(primary) == "zero1"
    made = float8_profile(profile, primary).layers[1]
    # the step's share a rank runs is step_ms / K (dataparallel.device_step_ms): shard_bytes of its n / K shard
    # elements and 2 B of its n local ones
    shard_ms = shard_bytes * n / dp / fused * 1e3 + (2 * n / fused * 1e3 if transposed else 0.0)
    assert dataparallel.device_step_ms(made.step_ms["adam"] - block.step_ms["adam"], primary) == pytest.approx(shard_ms)
    # the parameter is the FP8 tensor: no weight cast in any microbatch's forward or rerun, no transpose there
    record = cost_float8.runtime_profile(profile, primary).layers[1].float8  # on TE's fused kernels
    assert made.fwd_ms == pytest.approx(record.fwd_ms) and made.bwd_ms == pytest.approx(record.bwd_ms)
    if recipe == "fp8_current_scaling":  # without FP8 weights: TE's workspace cast, once a step, 5 B a local element
        before = float8_profile(profile, setup(**te)).layers[1]
        assert dataparallel.device_step_ms(before.step_ms["adam"] - block.step_ms["adam"], setup(**te)) == \
            pytest.approx(block.float8.weight_cast_ms) == pytest.approx(5 * n / fused * 1e3)
        assert made.fwd_ms == before.fwd_ms and made.recompute_ms == before.recompute_ms
    # neither recipe named (blockwise, MXFP8: their casts not read): not applied
    assert not cost_float8.te_primary_weights(setup(**(te | {recipe: False}), fp8_all_gather=True))


@pytest.mark.parametrize("gpu, transposed", [("h100", True), ("b200", False)])
def test_megatron_fsdp_casts_its_fp8_shard_once_a_step_and_transposes_every_forward_and_backward_on_hopper(
        gpu, transposed):
    # megatron-core 92c8482e's copy_main_weights_to_model_weights calls TE's cast_master_weights_to_fp8 with the FSDP
    # shards (framework-facts §673): 11 B a shard element under current scaling, no transpose kept across
    # microbatches: the unit's post-forward and post-backward drop it, so on Hopper the forward makes it (1 + 1 B a
    # weight element) and the backward makes it again; none on Blackwell
    from planner.cost import float8 as cost_float8
    from planner.cost import megatron_fsdp

    profile, block, n, fused = _fp8_weights_case(gpu)
    te = dict(runtime="megatron", float8=True, fp8_current_scaling=True, dp=8, zero=3)
    fsdp = setup(**te, fp8_all_gather=True)
    assert megatron_fsdp.runs(fsdp) and cost_float8.te_primary_weights(fsdp) == "megatron-fsdp"
    made = float8_profile(profile, fsdp).layers[1]
    assert dataparallel.device_step_ms(made.step_ms["adam"] - block.step_ms["adam"], fsdp) == \
        pytest.approx(11 * n / 8 / fused * 1e3)
    record = cost_float8.runtime_profile(profile, fsdp).layers[1].float8
    transpose_ms = 2 * n / fused * 1e3 if transposed else 0.0
    assert made.fwd_ms == pytest.approx(record.fwd_ms + transpose_ms)
    assert made.bwd_ms == pytest.approx(record.bwd_ms + transpose_ms)
    assert made.recompute_ms == pytest.approx(cost_float8.float8_profile(profile, setup(**te)).layers[1].recompute_ms)
    # ZeRO 1 over the same ranks: the transpose once a step (K x 2 B a shard element), none in the passes
    zero1 = setup(**(te | {"zero": 1}), fp8_all_gather=True)
    one = float8_profile(profile, zero1).layers[1]
    assert one.fwd_ms == pytest.approx(record.fwd_ms)
    assert dataparallel.device_step_ms(one.step_ms["adam"] - block.step_ms["adam"], zero1) == \
        pytest.approx(11 * n / 8 / fused * 1e3 + transpose_ms)


@pytest.mark.parametrize("gpu, transposed", [("h100", True), ("b200", False)])
def test_a_fully_recomputed_megatron_fsdp_layer_transposes_twice_a_microbatch_not_three_times(gpu, transposed):
    # megatron_fsdp.py 492-504 at 92c8482e (framework-facts §673, §676): the post-forward is skipped while the
    # recompute reruns the unit, so the rerun's transpose (1 + 1 B a weight element) stays on the FP8 parameter and
    # the backward reuses it: forward 1 + rerun 1 + backward 0 = 2 transposes, where a whole forward for the rerun
    # beside the backward's own charged 3
    from planner.cost import costmodel
    from planner.cost.rules import layer_time_ms, recompute_ms

    profile, _, n, fused = _fp8_weights_case(gpu)
    fsdp = setup(runtime="megatron", float8=True, fp8_current_scaling=True, dp=8, zero=3, fp8_all_gather=True)
    made = float8_profile(profile, fsdp)
    layer = costmodel.layer_costs(made)[1]
    one = 2 * n / fused * 1e3 if transposed else 0.0  # one transpose of the layer's n FP8 weight elements
    assert recompute_ms(layer, fsdp, made) == pytest.approx(layer.fwd_ms - one)
    assert recompute_ms(layer, fsdp) == layer.fwd_ms  # no profile, no GPU: the whole forward, as before
    from planner.cost import float8 as cost_float8

    record = cost_float8.runtime_profile(profile, fsdp).layers[1].float8  # the passes without a transpose
    assert layer_time_ms(layer, 1, fsdp, made) == \
        pytest.approx(record.fwd_ms + record.bwd_ms + record.fwd_ms + 2 * one, rel=1e-9)
