"""Megatron-core's blocks on Transformer Engine's fused kernels (planner/profiler/te_fused.py,
planner/cost/fusedkernels.py): the bytes the fused norms, rotary and activations move less, counted
by hand on a tiny block; the record applied under --runtime megatron only; Float8's record moved by
the same differences."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from planner.cli import cli
from planner.cost import runtimes
from planner.cost.float8 import float8_profile
from planner.cost.fusedkernels import fused_profile, untimed_layers
from planner.models import archs
from planner.profiler import analytic, analytic_time, float8, te_fused
from planner.profiler.analytic import Shape
from planner.profiler.membound import membound_ms
from planner.profiler.roofline import Kernel, Work, kernel_ms, roofline_ms
from planner.schema import FileRef, TrainSetup

H100 = archs.gpu("h100")
TINY = archs.Arch(name="tiny-llama", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                  num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=1024)
TINY_GPT = dataclasses.replace(TINY, name="tiny-gpt", style="gpt", intermediate_size=256, mlp_act="gelu")
REF = FileRef(file="arch:test", sha256="0" * 64)
SHAPE = Shape(seq_len=128, micro_batch_size=2)  # 256 tokens


def test_a_llama_block_saves_the_fused_norms_rotary_and_swiglu_bytes_by_hand():
    T, h, f = 256, 64, 160
    q, kv = 4 * 16, 2 * 16  # 4 query heads and 2 K/V heads of 16
    # two RMSNorms: eager 36 B / element + 28 B / token forward, 96 + 44 backward; TE 4 + 4 and 6 + 4
    norms = (2 * ((36 - 4) * T * h + (28 - 4) * T), 2 * ((96 - 6) * T * h + (44 - 4) * T))
    # rotary over Q and K: eager 20 and 32 B / element, fused 4 and 4
    rope = ((20 - 4) * T * (q + kv), (32 - 4) * T * (q + kv))
    # SwiGLU per element of the width-f product: eager 10 and 18, fused 6 and 10
    swiglu = ((10 - 6) * T * f, (18 - 10) * T * f)
    assert te_fused.fused_bytes_saved(TINY, SHAPE) == (norms[0] + rope[0] + swiglu[0], norms[1] + rope[1] + swiglu[1])


def test_the_fused_kernels_own_bytes_by_hand():
    """What the fused kernels move (at the fused kernels' rate, planner/profiler/membound.py): two TE
    norms 4 + 4 B forward (element, token), 6 + 4 backward; rotary 4 and 4 over Q and K; SwiGLU 6 and 10;
    a GPT block's bias-GELU 4 and 6."""
    T, h, f, rotated = 256, 64, 160, 256 * (64 + 32)
    assert te_fused.fused_kernel_bytes(TINY, SHAPE) == (2 * (4 * T * h + 4 * T) + 4 * rotated + 6 * T * f,
                                                        2 * (6 * T * h + 4 * T) + 4 * rotated + 10 * T * f)
    assert te_fused.fused_kernel_bytes(TINY_GPT, SHAPE) == (4 * 256 * 256, 6 * 256 * 256)


def test_a_gpt_block_saves_the_fused_bias_gelu_bytes_only():
    # gelu_new eager 36 / 56 B an element of the width-f activation, Megatron's fused bias-GELU 4 / 6;
    # its LayerNorms already move TE's 4 / 6
    assert te_fused.fused_bytes_saved(TINY_GPT, SHAPE) == ((36 - 4) * 256 * 256, (56 - 6) * 256 * 256)


def test_blocks_whose_fused_kernels_were_not_read_get_no_record():
    assert te_fused.fused_bytes_saved(dataclasses.replace(TINY, qk_norm=True), SHAPE) is not None  # tests/test_qknorm.py
    assert te_fused.fused_bytes_saved(TINY, dataclasses.replace(SHAPE, attention="eager")) is None
    passes = analytic_time.block_work(TINY, SHAPE)
    assert te_fused.te_time(TINY, SHAPE, H100, passes, moe=True) is None  # no experts: no MoE record (te_moe.py)


@pytest.mark.parametrize("name", ["h100", "b200"])
def test_the_record_is_the_eager_passes_less_the_saved_bytes_the_fused_ones_at_their_rate(name):
    gpu = archs.gpu(name)
    te_gpu = te_fused.te_attention_gpu(gpu)  # its attention at cuDNN's published figures
    passes = analytic_time.block_work(TINY, SHAPE)
    saved_fwd, saved_bwd = te_fused.fused_bytes_saved(TINY, SHAPE)
    fused_fwd, fused_bwd = te_fused.fused_kernel_bytes(TINY, SHAPE)
    timed = te_fused.te_time(TINY, SHAPE, gpu, passes, moe=False)

    T, h, f, rotated = 256, 64, 160, 256 * (64 + 32)  # Q 4 heads x 16 wide, K and V 2 x 16: rotary on Q and K
    # the eager bytes each class loses to the fused kernels, by hand: the two RMSNorms (36 B an element and 28 a
    # token forward, 96 and 44 backward), rotary (20, 32 B an element of Q and K), SwiGLU (10, 18 B an element of f)
    replaced = ({"norm": 2 * (36 * T * h + 28 * T), "attention": 20 * rotated, "activation": 10 * T * f},
                {"norm": 2 * (96 * T * h + 44 * T), "attention": 32 * rotated, "activation": 18 * T * f})

    def expected(done, cut, fused, times, gone):  # TE's fused Q/K/V and gate/up GEMMs, the saved bytes off, of the
        # bytes left the fused kernels' own at the fused kernels' rate (Work.fused_bytes), the rest at its class's
        classes = tuple((name, num - gone.get(name, 0)) for name, num in done.classed if num > gone.get(name, 0))
        left = Work(done.flops, done.bytes - cut, done.kernels, fused, classes)
        assert sum(num for _, num in classes) == done.bytes - cut - fused  # every eager byte left keeps a class
        return roofline_ms(te_fused._fused_gemms(left, TINY, SHAPE, times), te_gpu)

    assert timed.fwd_ms == pytest.approx(expected(passes[0], saved_fwd, fused_fwd, 1, replaced[0]), rel=1e-12)
    # the backward under Megatron's gradient-accumulation fusion: no eager .grad accumulation (6 B a parameter,
    # elementwise; tests/test_gradfusion.py), the block's 43,136 parameters' (qkv, o, gate/up/down, two norms)
    accumulate = 6 * (64 * 128 + 64 * 64 + 3 * 64 * 160 + 2 * 64)
    assert timed.bwd_ms == pytest.approx(expected(passes[1], saved_bwd + accumulate, fused_bwd, 2,
                                                  {**replaced[1], "elementwise": accumulate}), rel=1e-12)
    assert timed.accumulate_ms == pytest.approx(membound_ms(accumulate, te_gpu, "eager", "elementwise"), rel=1e-12)
    # the full rerun runs the forward's norms, rotary and SwiGLU again (it stops before w2 and its add)
    assert timed.recompute_ms["full"] == pytest.approx(expected(passes[2], saved_fwd, fused_fwd, 1, replaced[0]),
                                                       rel=1e-12)


def test_te_runs_q_k_v_as_one_gemm_and_gate_up_as_one():
    T, h, f = 256, 64, 160  # Q 4 heads x 16 wide, K and V 2 x 16
    fwd, bwd, rerun = analytic_time.block_work(TINY, SHAPE)
    attention = [kernel for kernel, _ in fwd.kernels if kernel.kind == "attention-fwd"]
    qkv, proj, fc1, fc2 = 2 * T * h * (64 + 32 + 32), 2 * T * 64 * h, 2 * T * h * 2 * f, 2 * T * f * h
    assert te_fused._fused_gemms(fwd, TINY, SHAPE, 1).kernels == tuple(sorted(
        [(attention[0], 1)] + [(Kernel("matmul", flops), 1) for flops in (qkv, proj, fc1, fc2)],
        key=lambda item: (item[0].kind, item[0].flops)))
    assert dict(te_fused._fused_gemms(bwd, TINY, SHAPE, 2).kernels)[Kernel("matmul", qkv)] == 2
    # the rerun stops before the down projection: Q/K/V and gate/up fused, no fc2
    assert {kernel.flops for kernel, _ in te_fused._fused_gemms(rerun, TINY, SHAPE, 1).kernels
            if kernel.kind == "matmul"} == {qkv, proj, fc1}
    # Float8 on TE's linears: one input cast for Q/K/V and one for gate/up (5 B an element each)
    timed = te_fused.te_time(TINY, SHAPE, H100, (fwd, bwd, rerun), moe=False)
    assert [linear.fqn.split(".")[-1] for linear in float8.te_linears(TINY, SHAPE, "layers.0")] == [
        "linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
    assert timed.float8 is not None and timed.float8.param_count == h * 128 + 64 * h + h * 2 * f + f * h


def test_te_attention_runs_at_cudnns_published_rate_where_there_is_one():
    # one causal attention kernel of 8192 tokens, 32 heads of 128, batch 1: 4·s²·d·heads FLOPs, half run
    flops = 4 * 8192 * 8192 * 128 * 32
    fwd = Kernel("attention-fwd", flops, 0.5, 8192)
    bwd = Kernel("attention-bwd", int(2.5 * flops), 0.5, 8192)
    # cudnn-frontend's training benchmark, cuDNN 9.19 on H200 (the H100's chip): 64 heads of 128, 8192 tokens,
    # causal, batch 1: forward 1.708 ms, backward 5.083 ms; the FLOPs per head are 4 * 8192² * 128 / 2
    head = 4 * 8192 * 8192 * 128 / 2
    te_h100 = te_fused.te_attention_gpu(H100)
    assert kernel_ms(fwd, te_h100) == pytest.approx(1.708 * 32 / 64, rel=1e-9)
    assert kernel_ms(bwd, te_h100) == pytest.approx(5.083 * 32 / 64, rel=1e-9)
    assert 64 * head / 1.708e-3 / 1e12 == pytest.approx(643.7, abs=0.05)
    assert kernel_ms(fwd, te_h100) < kernel_ms(fwd, H100)  # torch's SDPA flash: 298 TFLOP/s at 8192
    # GB200, cuDNN 9.22, 64 heads, batch 2: 1.397 / 4.127 ms; B200, cuDNN 9.13.1, 128 heads, batch 1: 1.877 / 5.833
    for name, head_seqs, fwd_ms, bwd_ms in (("gb200", 128, 1.397, 4.127), ("b200", 128, 1.877, 5.833)):
        te_gpu = te_fused.te_attention_gpu(archs.gpu(name))
        assert kernel_ms(fwd, te_gpu) == pytest.approx(fwd_ms * 32 / head_seqs, rel=1e-9)
        assert kernel_ms(bwd, te_gpu) == pytest.approx(bwd_ms * 32 / head_seqs, rel=1e-9)
    a100 = archs.gpu("a100-80g")  # TE runs FlashAttention-2 there: its own attention figures
    assert te_fused.te_attention_gpu(a100) is a100 and not a100.te_attention_efficiency


def _setup(runtime: str, **fields) -> TrainSetup:
    base = dict(stages=1, microbatches=1, micro_batch_size=2, mem_caps_bytes=[2**50], precision="bf16-mixed",
                runtime=runtime)
    return TrainSetup(**(base | fields))


def test_megatron_times_the_blocks_by_the_record_and_torchtitan_does_not():
    profile = analytic.analytic_profile(TINY, SHAPE, gpu=H100, model=REF)
    block = profile.layers[1]
    assert block.te_time is not None and runtimes.facts("megatron").fused_kernels == "transformer-engine"
    as_megatron = float8_profile(profile, _setup("megatron")).layers[1]
    assert (as_megatron.fwd_ms, as_megatron.bwd_ms, as_megatron.recompute_ms) == (
        block.te_time.fwd_ms, block.te_time.bwd_ms, block.te_time.recompute_ms["full"])
    assert float8_profile(profile, _setup("torchtitan")).layers[1] == block
    assert untimed_layers(profile) == []


def test_the_float8_record_is_the_te_records_or_moves_by_the_same_differences():
    mid = dataclasses.replace(TINY, hidden_size=2048, intermediate_size=8192, num_heads=16, num_kv_heads=8,
                              vocab_size=1024)
    shape = Shape(seq_len=1024, micro_batch_size=8)
    profile = analytic.analytic_profile(mid, shape, gpu=H100, model=REF)
    block = profile.layers[1]
    timed = fused_profile(profile, "transformer-engine").layers[1]
    record = block.te_time.float8  # TE's linears' own record, with the selective combinations holding mlp summed
    assert timed.float8.model_copy(update={"recompute_ms": record.recompute_ms,
                                           "rerun_weight_cast_ms": record.rerun_weight_cast_ms}) == record
    assert {name: ms for name, ms in timed.float8.recompute_ms.items() if name in record.recompute_ms} == record.recompute_ms
    assert all("mlp" in name.split(",") for name in set(timed.float8.recompute_ms) - set(record.recompute_ms))
    # fewer casts and larger GEMMs than torchtitan's seven linears: faster than the shifted record, once the
    # Hopper transposes TE writes (1 B an input element; torchao's record counts none) are set apart

    shifted = block.float8.fwd_ms - (block.fwd_ms - block.te_time.fwd_ms)
    transposes = sum(linear.tokens * linear.k for linear in float8.te_linears(mid, shape, "layers.0"))
    assert float8.transpose_bytes(H100) == 1 and transposes == 8192 * (2048 + 2048 + 2048 + 8192)
    assert timed.float8.fwd_ms - membound_ms(transposes, te_fused.te_attention_gpu(H100), "fused") < shifted
    # a record without Float8 times (a profile made before them): the layer's moved by the differences
    bare = profile.model_copy(update={"layers": [layer.model_copy(update={"te_time": layer.te_time.model_copy(
        update={"float8": None})}) if layer.te_time else layer for layer in profile.layers]})
    moved = fused_profile(bare, "transformer-engine").layers[1]
    assert moved.float8.fwd_ms == pytest.approx(shifted, rel=1e-12)
    assert moved.float8.bwd_ms == pytest.approx(block.float8.bwd_ms - (block.bwd_ms - block.te_time.bwd_ms), rel=1e-12)
    assert moved.float8.recompute_ms["full"] == pytest.approx(
        block.float8.recompute_ms["full"] - (block.recompute_ms - block.te_time.recompute_ms["full"]), rel=1e-12)
    # applied once: the record is dropped from the timed layer
    assert timed.te_time is None and fused_profile(fused_profile(profile, "transformer-engine"),
                                                   "transformer-engine").layers[1] == timed


def _evaluate(path, runtime: str):
    return CliRunner().invoke(cli, ["evaluate", "--profile", str(path), "--layers-per-stage", "4", "--ckpt-per-stage",
                                    "0", "--microbatches", "1", "--mem", "200GB", "--precision", "bf16-mixed",
                                    "--runtime", runtime, "--json"])


def _iteration_ms(result) -> float:
    assert result.exit_code == 0, result.output
    found, _ = json.JSONDecoder().raw_decode(result.output[result.output.index("{"):])
    return found["hand"]["iteration_ms"]


def test_the_cli_times_megatron_on_the_fused_kernels_and_says_so(tmp_path):
    analytic_path, fake_like = tmp_path / "analytic.json", tmp_path / "bare.json"
    # on B200, whose host has no published CPU time per call: a 256-token block on H100 is host-bound in both
    # passes (planner/cost/hosttime.py), which hides the kernels' difference this test reads
    profile = analytic.analytic_profile(TINY, SHAPE, gpu=archs.gpu("b200"), model=REF)
    analytic_path.write_text(profile.model_dump_json())
    # the same profile without the records, as a fake or older profile is
    fake_like.write_text(profile.model_copy(update={"layers": [layer.model_copy(update={"te_time": None})
                                                               for layer in profile.layers]}).model_dump_json())
    megatron = _evaluate(analytic_path, "megatron")
    assert "2 of 2 blocks timed on Transformer Engine's fused" in megatron.output
    assert _iteration_ms(megatron) < _iteration_ms(_evaluate(fake_like, "megatron"))
    # other runtimes time the profile's passes as made: the records change nothing there
    assert _iteration_ms(_evaluate(fake_like, "torchtitan")) == _iteration_ms(_evaluate(analytic_path, "torchtitan"))
    bare = _evaluate(fake_like, "megatron")
    assert "2 (layers.0, ...) timed as the profile's own passes" in bare.output


def test_a_fake_profiles_class_named_layers_are_said_untimed_not_zero_of_zero(tmp_path):
    # a fake or measured profile names its layers' kinds by class ("Block", "Phi3DecoderLayer") and records no
    # fused times: evaluate said "0 of 0 blocks timed on Transformer Engine's fused ..."
    profile = analytic.analytic_profile(TINY, SHAPE, gpu=H100, model=REF)
    fake = profile.model_copy(update={"source": "fake", "layers": [
        layer.model_copy(update={"te_time": None, "kind": "Block"}) for layer in profile.layers]})
    path = tmp_path / "fake.json"
    path.write_text(fake.model_dump_json())
    said = " ".join(_evaluate(path, "megatron").output.split())
    assert "0 of 0 blocks" not in said
    assert ("--runtime megatron: the fake profile records no layer's passes on Transformer Engine's fused norms, "
            "rotary and activations, so its 4 layers are timed as the profile's own passes") in said


def test_the_whole_job_search_times_megatron_as_evaluate_does():
    from planner.solve.jobsearch import Profiles

    profile = analytic.analytic_profile(TINY, SHAPE, gpu=H100, model=REF)
    profiles = Profiles(lambda tp, sp, mbs, cp=1: profile)
    layers = profiles.get(1, False, 2)[1]
    as_megatron, _ = profiles.for_setup(profile, layers, _setup("megatron"))
    assert as_megatron.layers[1].fwd_ms == profile.layers[1].te_time.fwd_ms
    assert profiles.for_setup(profile, layers, _setup("torchtitan"))[0] is profile


def test_a_fake_profiles_blocks_are_its_repeated_class_and_named_when_untimed():
    """A fake profile's kinds are the model's class names: its blocks are the kind that repeats (the
    embedding and head are one each); without a record they are named as timed as profiled."""
    from planner.cost.fusedkernels import blocks

    profile = analytic.analytic_profile(TINY, SHAPE, gpu=H100, model=REF)
    renamed = [layer.model_copy(update={"kind": "LlamaDecoderLayer" if layer.kind == "decoder_block"
                                        else f"{layer.kind.title()}Module"}) for layer in profile.layers]
    fake_like = profile.model_copy(update={"layers": renamed})
    assert [layer.name for layer in blocks(fake_like)] == ["layers.0", "layers.1"]
    assert untimed_layers(fake_like) == []  # the records an --hf-config's fake profile carries
    bare = fake_like.model_copy(update={"layers": [layer.model_copy(update={"te_time": None}) for layer in renamed]})
    assert untimed_layers(bare) == ["layers.0", "layers.1"]


def test_te_fp8_casts_by_hand():
    # TINY's block on TE's linears, 256 tokens: linear_qkv 64 -> 64 + 2 x 32, linear_proj 64 -> 64,
    # linear_fc1 64 -> 2 x 160, linear_fc2 160 -> 64 (float8.te_linears); on B200 (sm100), whose FP8 GEMMs take
    # the non-TN layouts: no transpose written
    from planner.profiler import float8
    from planner.profiler.roofline import work

    T, B200 = 256, archs.gpu("b200")
    linears = float8.te_linears(TINY, SHAPE, "layers.0")
    gemms = [Kernel("matmul", item.flops) for item in linears]
    fwd, weights = float8.te_forward(work(0, 0, gemms), linears, B200)
    # qkv's and fc1's inputs from the norm with its amax: read 2 + write 1; proj's and fc2's: amax read,
    # read, write (5)
    assert fwd.bytes == T * (3 * 64 + 5 * 64 + 3 * 64 + 5 * 160) == 385_024
    assert weights == 64 * 128 + 64 * 64 + 64 * 320 + 160 * 64
    # backward: each grad_output cast once (5 B); the saved float8 inputs are not cast again
    bwd = float8.te_backward(work(0, 0, gemms * 2), linears, B200)
    assert bwd.bytes == 5 * T * (128 + 64 + 320 + 64) == 737_280
    # torchao's count on the same linears (no norm fusion; the inputs cast again for the weight grads)
    assert float8.forward(work(0, 0, gemms), linears)[0].bytes == 5 * T * (64 + 64 + 64 + 160)
    assert float8.backward(work(0, 0, gemms * 2), linears).bytes == 5 * T * ((128 + 64 + 320 + 64) + (64 + 64 + 64 + 160))


def test_te_fp8_hopper_transposes_by_hand(monkeypatch):
    # the same block on H100 (sm90, TN-only FP8 GEMMs): each input quantize and each grad_output quantize also
    # writes the transposed (column-wise) FP8 copy, 1 B an element: the forward's 4 inputs, T x (64 + 64 + 64 +
    # 160) elements, the backward's 4 grad_outputs, T x (128 + 64 + 320 + 64)
    from planner.profiler import float8, te_moe_float8
    from planner.profiler.roofline import work

    T, B200 = 256, archs.gpu("b200")
    linears = float8.te_linears(TINY, SHAPE, "layers.0")
    gemms = [Kernel("matmul", item.flops) for item in linears]
    assert float8.transpose_bytes(H100) == 1 and float8.transpose_bytes(B200) == 0
    assert te_moe_float8.transpose_bytes is float8.transpose_bytes  # one count for the dense and the MoE records
    fwd = float8.te_forward(work(0, 0, gemms), linears, H100)[0].bytes
    assert fwd == T * (4 * 64 + 6 * 64 + 4 * 64 + 6 * 160) == 475_136
    assert fwd - float8.te_forward(work(0, 0, gemms), linears, B200)[0].bytes == T * 352
    bwd = float8.te_backward(work(0, 0, gemms * 2), linears, H100).bytes
    assert bwd == 6 * T * (128 + 64 + 320 + 64) == 884_736
    # the record: the Hopper transposes' bytes at the fused kernels' rate, in the forward, the full rerun (which
    # runs under grad: column-wise usage asked for) and the backward; nothing else moves

    passes = analytic_time.block_work(TINY, SHAPE, moe=False)
    hopper = te_fused.te_time(TINY, SHAPE, H100, passes, moe=False).float8
    monkeypatch.setattr(float8, "transpose_bytes", lambda gpu: 0)
    plain = te_fused.te_time(TINY, SHAPE, H100, passes, moe=False).float8
    gpu = te_fused.te_attention_gpu(H100)
    assert hopper.fwd_ms - plain.fwd_ms == pytest.approx(membound_ms(T * 352, gpu, "fused"), rel=1e-9)
    # the full rerun's three linears (the record's rerun stops before linear_fc2): T x (64 + 64 + 64)
    assert hopper.recompute_ms["full"] - plain.recompute_ms["full"] == pytest.approx(membound_ms(T * 192, gpu, "fused"),
                                                                                    rel=1e-9)
    assert hopper.bwd_ms - plain.bwd_ms == pytest.approx(membound_ms(T * 576, gpu, "fused"), rel=1e-9)
    assert hopper.param_count == plain.param_count and hopper.transient_bytes == plain.transient_bytes


def test_te_casts_a_weight_once_a_step_not_per_forward():
    # TE caches a weight's float8 copy across microbatches (is_first_microbatch): the cast is in the
    # layer's step time, whole on every rank (the cost model divides the step by the shard group: taken x K)
    profile = analytic.analytic_profile(TINY, SHAPE, gpu=H100, model=REF)
    block = profile.layers[1]
    record = block.te_time.float8
    assert runtimes.facts("megatron").float8 == "transformer-engine" and record.weight_cast_ms > 0
    layer = float8_profile(profile, _setup("megatron", float8=True, dp=4, zero=1)).layers[1]
    assert layer.fwd_ms == record.fwd_ms and layer.recompute_ms == record.recompute_ms["full"]
    shard = layer.step_ms["adam"] - block.step_ms["adam"]
    from planner.cost import dataparallel

    K = dataparallel.shard_size(_setup("megatron", float8=True, dp=4, zero=1))
    assert shard == pytest.approx(K * record.weight_cast_ms, rel=1e-12)
    # torchtitan's torchao casts per forward
    titan = float8_profile(profile, _setup("torchtitan", float8=True)).layers[1]
    assert titan.fwd_ms == pytest.approx(block.float8.fwd_ms + block.float8.weight_cast_ms, rel=1e-12)
