"""A Megatron-core MoE block under Transformer Engine's FP8 current scaling (planner/profiler/te_moe_float8.py,
planner/cost/te_moe_float8.py; docs/framework-facts.md §99): the grouped GEMMs in FP8 with their quantizes counted
by hand on a tiny block, the FP8 saved inputs in place of the bf16 ones, and a Megatron flags file's FP8 scored."""

from __future__ import annotations

from collections import Counter

from click.testing import CliRunner

from planner.cli import cli
from planner.cost import bridgesettings, runtimes
from planner.cost import te_moe_float8 as cost_fp8
from planner.cost.float8 import float8_profile
from planner.cost.runtime_megatron import megatron
from planner.models import archs
from planner.profiler import analytic, analytic_time, te_fused
from planner.profiler import te_moe_float8 as fp8
from planner.profiler.analytic import Shape
from planner.schema import FileRef

H100, B200 = archs.gpu("h100"), archs.gpu("b200")
REF = FileRef(file="arch:test", sha256="0" * 64)
# h 64, 4 heads of 16, 2 K/V heads (linear_qkv 64 -> 128); every layer MoE: 8 experts of width 16, top 2
TINY = archs.Arch(name="tiny-moe-fp8", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                  num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
                  moe_intermediate_size=16)
SHAPE = Shape(seq_len=32, micro_batch_size=2)  # T 64 tokens, S 128 copies; ep 1: 8 experts of 16 rows
T, h, q, S, f = 64, 64, 64, 128, 16


def _te_passes(gpu=H100, shape=SHAPE):
    passes = analytic_time.block_work(TINY, shape, moe=True)
    return passes, te_fused.te_time(TINY, shape, gpu, passes, moe=True)


def test_each_experts_gate_and_up_run_as_linear_fc1s_one_gemm():
    passes = analytic_time.block_work(TINY, SHAPE, moe=True)
    fwd = fp8.grouped_fc1(passes[0], TINY, SHAPE, 1)
    bwd = fp8.grouped_fc1(passes[1], TINY, SHAPE, 2)
    before, after = Counter(dict(passes[0].kernels)), Counter(dict(fwd.kernels))
    gate = 2 * 16 * h * f  # one expert's gate (= up = down): 32,768 FLOPs
    assert before[fp8.Kernel("matmul", gate)] == 3 * 8 and after[fp8.Kernel("matmul", gate)] == 8
    assert after[fp8.Kernel("matmul", 2 * gate)] == 8 + 1 and fwd.flops  # + the router's 2 T h E, 65,536 too == passes[0].flops
    assert Counter(dict(bwd.kernels))[fp8.Kernel("matmul", 2 * gate)] == 16 + 2
    assert fp8.grouped_fc1(fwd, TINY, SHAPE, 1) == fwd  # already merged: as it is


def test_the_forwards_quantizes_by_hand_on_hopper_and_blackwell():
    (_, timed) = _te_passes()
    linears = fp8.moe_linears(TINY, SHAPE, "layers.0")
    assert [linear.fqn.rsplit(".", 2)[-2:] for linear in linears[:4]] == [
        ["self_attention", "linear_qkv"], ["self_attention", "linear_proj"], ["linear_fc1", "0"], ["linear_fc2", "0"]]
    assert len(linears) == 2 + 2 * 8
    passes = analytic_time.block_work(TINY, SHAPE, moe=True)
    fwd = fp8.grouped_fc1(te_fused._fused_gemms(passes[0], TINY, SHAPE, 1), TINY, SHAPE, 1)  # as te_time's
    # linear_qkv: the norm wrote its amax; quantize reads 2, writes 1, + the Hopper transpose 1: 4 T h; the others
    # amax 2 + cast 2 + 1 + transpose 1: linear_proj 6 T q, linear_fc1 6 S h (every expert's split), fc2 6 S f
    hopper = 4 * T * h + 6 * T * q + 6 * S * h + 6 * S * f
    assert hopper == 102400
    done, weights = fp8.forward_work(fwd, linears, H100)
    assert done.bytes - fwd.bytes == done.fused_bytes - fwd.fused_bytes == hopper
    assert weights == h * 128 + q * h + 8 * (h * 2 * f + f * h)
    assert Counter(kernel.kind for kernel, count in done.kernels for _ in range(count))["matmul-fp8"] == 2 + 16
    blackwell = 3 * T * h + 5 * T * q + 5 * S * h + 5 * S * f  # no transpose: the column-wise usage reads the data
    assert fp8.forward_work(fwd, linears, B200)[0].bytes - fwd.bytes == blackwell == 83968


def test_the_backwards_grad_output_quantizes_by_hand():
    passes = analytic_time.block_work(TINY, SHAPE, moe=True)
    bwd = fp8.grouped_fc1(te_fused._fused_gemms(passes[1], TINY, SHAPE, 2), TINY, SHAPE, 2)
    linears = fp8.moe_linears(TINY, SHAPE, "layers.0")
    # each grad_output once, row-wise and (Hopper) column-wise: qkv's T x 128, proj's T x h, fc1's S x 2f, fc2's S x h
    done = fp8.backward_work(bwd, linears, H100)
    assert done.bytes - bwd.bytes == 6 * (T * 128 + T * h + S * 2 * f + S * h) == 147456
    assert Counter(kernel.kind for kernel, count in done.kernels for _ in range(count))["matmul-fp8"] == 2 * 18


def test_the_record_on_the_te_passes_and_at_expert_parallelism():
    passes, timed = _te_passes()
    record = timed.float8
    assert record is not None and record.bwd_input_recast_ms == 0.0
    assert record.param_count == h * 128 + q * h  # the attention's: the cost model holds the experts' apart
    # the largest grad_output's FP8 copies, row- and column-wise: linear_qkv's (T x 128) over fc1's every expert (S x 2f)
    assert record.transient_bytes == 2 * max(T * 128, S * 2 * f) == 2 * T * 128
    assert record.fwd_ms > 0 and record.bwd_ms > 0 and record.weight_cast_ms > 0
    ep4 = Shape(seq_len=32, micro_batch_size=2, ep=4)  # 2 local experts of 64 rows: the same quantized bytes
    linears = fp8.expert_linears(TINY, ep4, "layers.0")
    assert [(linear.tokens, linear.k, linear.n) for linear in linears] == [(64, h, 2 * f), (64, f, h)] * 2
    assert _te_passes(shape=ep4)[1].float8 is not None


def test_no_record_without_fp8_tensor_cores_or_on_dims_fp8_gemms_refuse():
    passes = analytic_time.block_work(TINY, SHAPE, moe=True)
    a100 = archs.gpu("a100-80g")
    assert te_fused.te_time(TINY, SHAPE, a100, passes, moe=True).float8 is None
    odd = archs.Arch(**{**TINY.__dict__, "name": "tiny-odd", "moe_intermediate_size": 24})
    assert te_fused.te_time(odd, SHAPE, H100, analytic_time.block_work(odd, SHAPE, moe=True), moe=True).float8 is None


def test_the_hopper_list_is_the_cost_models():
    assert fp8.TN_ONLY_GPUS == bridgesettings.TN_ONLY_GPUS


def test_the_fp8_saved_inputs_by_hand():
    profile = analytic.analytic_profile(TINY, SHAPE, gpu=H100, model=REF)
    tensors = cost_fp8.saved_inputs(profile)
    assert tensors == {"norm_bf16": 2 * T * h, "norm": T * h, "attn_out": 2 * T * q, "proj": T * q,
                       "fc1_bf16": 2 * S * h, "fc1": S * h, "fc2_bf16": 2 * S * f, "fc2": S * f, "router": 3}
    assert cost_fp8.saved_inputs_delta(tensors) == -T * h + T * q - S * h - S * f == -10240


def _setup(*, float8: bool):
    from planner.schema import TrainSetup

    return TrainSetup(stages=1, microbatches=1, micro_batch_size=2, mem_caps_bytes=[2**50], precision="bf16-mixed",
                      runtime="megatron", float8=float8)


def test_under_megatrons_float8_a_moe_block_keeps_its_inputs_in_fp8():
    profile = analytic.analytic_profile(TINY, SHAPE, gpu=H100, model=REF)
    bf16, after = float8_profile(profile, _setup(float8=False)), float8_profile(profile, _setup(float8=True))
    for old, new in zip(bf16.layers, after.layers, strict=True):
        if old.kind != "moe_block":
            continue
        assert new.float8 is not None and new.fwd_ms != old.fwd_ms
        kept = {o.name: o.kept_bytes for o in old.recompute_options}
        now = {o.name: o.kept_bytes for o in new.recompute_options}
        assert now["none"] == kept["none"] - 10240 and now["full"] == kept["full"]
        made_old = [c for c in old.alloc_records["none"].forward if c > 0]
        record = new.alloc_records["none"]
        made = [c for c in record.forward if c > 0]
        # the input norm's output at 1 B (the second allocation); linear_proj's FP8 copy after the attention output
        assert made_old[1] == 2 * T * h and made[1] == T * h
        # then the MLP norm's input, statistics and output, and Megatron's mixture (router fp32 T E, bool T E, the
        # probs S in the logits' bf16, fc1's input, its output, fc2's input): fc1's input at 1 B; fc2's bf16 input
        # made, its FP8 copy made, the bf16 freed
        attention, mixture = [2 * T * h, 4 * T, 2 * T * h], [4 * T * 8, T * 8, 2 * S]
        assert _holds(made_old, [2 * T * q, *attention, *mixture, 2 * S * h, 2 * S * 2 * f, 2 * S * f])
        assert _holds(made, [2 * T * q, T * q, *attention, *mixture, S * h, 2 * S * 2 * f, 2 * S * f, S * f])
        assert sum(made) == sum(made_old) - 10240 + 2 * S * f  # the bf16 fc2 input: a transient
        count = sum(1 for c in [*record.forward, *record.backward] if c > 0)
        freed = {-c for c in [*record.forward, *record.backward] if c < 0}
        assert set(range(1, count + 1)) - freed == {record.output, record.input_grad}


def test_with_the_aux_loss_kept_the_fp8_inputs_are_still_found():
    # the aux loss's intermediate and counts sit between the top-k's tensors and fc1's input (5 router tensors, not
    # 3): the FP8 edits must still find the norm and the attention output before them (E2 lost them: its replay kept
    # the bf16 inputs, 3.4 GiB over its own count)
    from dataclasses import replace

    aux = analytic.analytic_profile(replace(TINY, name="tiny-moe-fp8-aux", router_aux_loss=True), SHAPE, gpu=H100,
                                    model=REF)
    assert cost_fp8.saved_inputs(aux)["router"] == 5
    bf16, after = float8_profile(aux, _setup(float8=False)), float8_profile(aux, _setup(float8=True))
    for old, new in zip(bf16.layers, after.layers, strict=True):
        if old.kind != "moe_block":
            continue
        made_old = [c for c in old.alloc_records["none"].forward if c > 0]
        made = [c for c in new.alloc_records["none"].forward if c > 0]
        attention, mixture = [2 * T * h, 4 * T, 2 * T * h], [4 * T * 8, T * 8, 4 * T * 8, 8 * 8, 2 * S]
        assert _holds(made_old, [2 * T * q, *attention, *mixture, 2 * S * h, 2 * S * 2 * f, 2 * S * f])
        assert made[1] == T * h
        assert _holds(made, [2 * T * q, T * q, *attention, *mixture, S * h, 2 * S * 2 * f, 2 * S * f, S * f])
        assert sum(made) == sum(made_old) - 10240 + 2 * S * f


def _holds(sizes: list[int], run: list[int]) -> bool:
    return any(sizes[at:at + len(run)] == run for at in range(len(sizes)))


def test_the_records_are_megatrons_only():
    profile = analytic.analytic_profile(TINY, SHAPE, gpu=H100, model=REF)
    assert cost_fp8.records_float8(profile, megatron())
    assert not cost_fp8.records_float8(profile, runtimes.facts("torchtitan"))


FLAGS = """\
MODEL_ARGS:
  --num-layers: 2
  --hidden-size: 64
  --ffn-hidden-size: 160
  --num-attention-heads: 4
  --group-query-attention: true
  --num-query-groups: 2
  --swiglu: true
  --normalization: RMSNorm
  --position-embedding-type: rope
  --untie-embeddings-and-output-weights: true
  --disable-bias-linear: true
  --seq-length: 32
  --max-position-embeddings: 32
  --vocab-size: 128
  --num-experts: 8
  --moe-ffn-hidden-size: 32
  --moe-router-topk: 2
  --moe-grouped-gemm: true
  --moe-permute-fusion: true
  --moe-router-fusion: true
  --moe-token-dispatcher-type: alltoall
  --expert-model-parallel-size: 2
  --micro-batch-size: 2
  --global-batch-size: 4
  --bf16: true
  --fp8-format: hybrid
  --fp8-recipe: tensorwise
  --transformer-impl: transformer_engine
"""


def test_a_megatron_flags_files_fp8_moe_job_is_scored_in_fp8(tmp_path):
    path = tmp_path / "moe_fp8.yaml"
    path.write_text(FLAGS)
    result = CliRunner().invoke(cli, ["evaluate", "--from-megatron", str(path), "--gpus", "2", "--gpu", "h100",
                                       "--json"])
    assert result.exit_code == 0, result.output
    assert "scored in bf16" not in result.output
