"""The host's time for the rest of a Megatron step (planner/cost/hosttime.py rest_ms, param_tensors, grad_hook_ms,
host_step_ms; scripts/bench_host_step.py): the record's figures in torch Linear forwards at the host's published
Linear (13.48 µs on the DGX H100's Xeon), hand counts of Megatron-core's parameter tensors, each charge where the
step's structure puts it, and the replica's loops doing what Megatron's do, exactly."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from fixtures.scripts import load_script

from planner.cost import hosttime, megatron_loss, rules, runtimes
from planner.cost.layers import layer_costs
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef, TrainSetup

bench = load_script("bench_host_step")
MODEL = FileRef(file="arch:test", sha256="0" * 64)
GPT = archs.Arch(name="tiny-gpt", hidden_size=64, intermediate_size=256, num_layers=1, num_heads=4, num_kv_heads=4,
                 vocab_size=128, style="gpt", tie_word_embeddings=True, max_position_embeddings=32)
LLAMA = archs.Arch(name="tiny-llama", hidden_size=64, intermediate_size=160, num_layers=1, num_heads=4, num_kv_heads=2,
                   vocab_size=128, tie_word_embeddings=False, max_position_embeddings=32)
CALL = 13.48e-3  # ms: one torch Linear forward on the DGX H100's host (TransformerEngine#2053)


def _setup(runtime="megatron", stages=1, **training) -> TrainSetup:
    return TrainSetup(stages=stages, microbatches=stages, micro_batch_size=1, mem_caps_bytes=[2**40] * stages,
                      precision="bf16-mixed", runtime=runtime, **training)


def _layers(arch, gpu="h100", seq=32):
    profile = analytic.analytic_profile(arch, Shape(seq_len=seq, micro_batch_size=1), gpu=archs.gpu(gpu), model=MODEL)
    return profile, layer_costs(profile)


def test_megatrons_record_reads_the_step_benchmark():
    assert runtimes.of(_setup().training).host_rest_linears[:8] == (  # the rest: tests/test_hosttime_calls.py
        ("embedding", 3.81, 5.63), ("output", 2.34, 5.90), ("loss", 12.76, 9.70), ("grad_hook", 0.18, 0.04),
        ("step", 0.48, 2.16), ("inner_step", 0.41, 0.0), ("zeros", 0.67, 0.08), ("params_norm", 0.03, 2.40))
    profile, _ = _layers(GPT)
    assert hosttime.rest_ms(profile, _setup(), "loss") == pytest.approx((12.76 * CALL, 9.70 * CALL))
    assert hosttime.rest_ms(profile, _setup("torchtitan"), "loss") == (0.0, 0.0)  # the record reads none
    assert hosttime.rest_ms(profile, _setup(), "no such part") == (0.0, 0.0)


def test_parameter_tensors_as_megatron_core_builds_them():
    profile, (embedding, block, head) = _layers(GPT)
    # GPT style: LayerNorm weight + bias twice, four linears with biases; word + learned position tables; the final
    # LayerNorm, the output weight the embedding's own tensor at one stage (tied), a copy on a pipeline's last stage
    assert [hosttime.param_tensors(layer, profile, _setup()) for layer in (embedding, block, head)] == [2, 12, 2]
    assert hosttime.param_tensors(head, profile, _setup(stages=2)) == 3
    profile, (embedding, block, head) = _layers(LLAMA)
    # LLaMA style: RMSNorm weights twice, four linears; rotary (no table); the untied output weight
    assert [hosttime.param_tensors(layer, profile, _setup()) for layer in (embedding, block, head)] == [1, 6, 2]
    profile, (_, block, _) = _layers(replace(LLAMA, qk_norm=True))
    assert hosttime.param_tensors(block, profile, _setup()) == 8


def test_the_grad_hook_adds_where_the_gemm_did_not():
    profile, (embedding, block, head) = _layers(GPT)
    fused, unfused = _setup(), _setup(unfused_grad_accumulation=True)
    # fused accumulation: the block's four linear weights skip main_grad.add_, its 8 biases and norms do not
    assert hosttime.grad_hook_ms(block, profile, fused) == pytest.approx((8 * 0.18 + 4 * 0.04) * CALL)
    assert hosttime.grad_hook_ms(block, profile, unfused) == pytest.approx(12 * 0.18 * CALL)
    assert hosttime.grad_hook_ms(embedding, profile, fused) == pytest.approx(2 * 0.18 * CALL)  # lookups' .grad
    assert hosttime.grad_hook_ms(head, profile, _setup(stages=2)) == pytest.approx((2 * 0.18 + 0.04) * CALL)


def test_the_embedding_pass_is_its_own_max():
    profile, (embedding, *_) = _layers(GPT)
    fwd, bwd = (3.81 + 5 * (0.14 + 0.40)) * CALL, (5.63 + 2 * 0.18) * CALL  # get_batch's five keys at one stage
    assert embedding.fwd_ms < fwd and embedding.bwd_ms < bwd  # 32 tokens' lookups: µs on the device
    assert hosttime.host_bound_ms(embedding, 0, profile, _setup()) == pytest.approx(
        fwd - embedding.fwd_ms + bwd - embedding.bwd_ms)
    slow = replace(embedding, fwd_ms=2 * fwd, bwd_ms=bwd / 2)
    assert hosttime.host_bound_ms(slow, 0, profile, _setup()) == pytest.approx(bwd / 2)
    assert hosttime.host_bound_ms(embedding, 0, profile, _setup("torchtitan")) == 0.0


def test_the_head_and_loss_are_one_span_against_their_device_time():
    profile, (*_, head) = _layers(GPT)
    setup = _setup()
    host = (2.34 + 5.90 + 12.76 + 9.70 + 2 * 0.18) * CALL
    loss = rules.stage_constant_ms(profile, 0, setup) + megatron_loss.vocab_parallel_ce_ms(profile, 0, setup)
    device = head.fwd_ms + head.bwd_ms + loss
    assert 0 < loss and device < host
    assert hosttime.host_bound_ms(head, 0, profile, setup) == pytest.approx(host - device)
    # LLaMA 3 8B's head and loss at 8,192 tokens on H100: a 128K-vocabulary GEMM and loss, far above the host's
    profile, layers = _layers(archs.arch("llama3-8b"), seq=8192)
    assert hosttime.host_bound_ms(layers[-1], 0, profile, setup) == 0.0


def test_the_step_charges_each_tensor_and_the_fixed_calls_once():
    # tiny passes on H100's host are host-bound: no lead, every loop charged
    profile, (embedding, block, head) = _layers(GPT)
    plain = _setup()
    assert hosttime.host_step_ms(block, profile, plain) == pytest.approx(12 * (0.48 + 0.41) * CALL)
    assert hosttime.host_step_ms(head, profile, plain) == pytest.approx(2 * (0.48 + 0.41) * CALL)
    assert hosttime.host_step_ms(embedding, profile, plain) == pytest.approx((2 * (0.48 + 0.41) + 2.16) * CALL)
    logged = _setup(log_params_norm=True, log_num_zeros_in_grad=True)
    assert hosttime.host_step_ms(block, profile, logged) == pytest.approx(12 * (0.48 + 0.41 + 0.67 + 0.03) * CALL)
    assert hosttime.host_step_ms(embedding, profile, logged) == pytest.approx(
        (2 * (0.48 + 0.41 + 0.67 + 0.03) + 2.16 + 0.08 + 2.40) * CALL)
    assert hosttime.host_step_ms(block, profile, _setup("torchtitan")) == 0.0
    profile_b200, (_, block_b200, _) = _layers(GPT, gpu="b200")  # no published Linear on DGX B200's host
    assert hosttime.host_step_ms(block_b200, profile_b200, logged) == 0.0


def test_the_loops_before_the_first_sync_hide_in_the_backwards_lead():
    profile, (embedding, block, _) = _layers(GPT)
    _, bwd = hosttime.host_block_ms(profile, _setup())
    logged, plain = _setup(log_params_norm=True, log_num_zeros_in_grad=True), _setup()
    # a backward the device runs 1 ms longer than the host issues it: a 1 ms lead, more than the loops
    slow = replace(block, bwd_ms=bwd + hosttime.grad_hook_ms(block, profile, plain) + 1.0)
    assert hosttime.host_step_ms(slow, profile, plain) == 0.0  # no .item() before the inner step: all hidden
    # count_zeros' .item() waits for the device: the inner step's and the params norm's loops after it are whole
    assert hosttime.host_step_ms(slow, profile, logged) == pytest.approx(12 * (0.41 + 0.03) * CALL)
    # a lead shorter than the loops hides that much of them
    lead = 12 * 0.2 * CALL
    short = replace(block, bwd_ms=bwd + hosttime.grad_hook_ms(block, profile, logged) + lead)
    assert hosttime.host_step_ms(short, profile, logged) == pytest.approx(12 * (0.48 + 0.67 - 0.2 + 0.41 + 0.03) * CALL)
    # the embedding's fixed calls are charged whole whatever its lead
    fast = replace(embedding, bwd_ms=10.0)
    assert hosttime.host_step_ms(fast, profile, plain) == pytest.approx(2.16 * CALL)


def test_the_replicas_loops_do_what_megatrons_do():
    torch.manual_seed(0)
    model = bench.Model(3, numel=8)
    before = [p.main_grad.clone() for p in model.params]
    bench.grad_hook(model, add=True)  # main_grad += grad (the stand-in grad is main_grad itself): doubled
    assert all(torch.equal(p.main_grad, 2 * b) for p, b in zip(model.params, before))
    assert all(p.grad is None for p in model.params)
    bench.grad_hook(model, add=False)
    assert all(torch.equal(p.main_grad, 2 * b) for p, b in zip(model.params, before))
    for m in model.mains:
        m.fill_(1.5)
    grads, clip = bench.step_loops(model)
    lists = bench.adam_loops(model)
    assert len(grads) == len(clip[1]) == len(lists[3]) == 3
    for p, m in zip(model.params, model.mains):  # each shard is the main_grad's first half; copied back
        assert torch.equal(m.grad, p.main_grad[:4]) and torch.equal(p.data[:4], torch.full((4,), 1.5))
    model.params[0].main_grad[:4] = torch.tensor([0.0, 0.0, 1.0, 0.0])
    model.params[1].main_grad[:4] = 0.0
    model.params[2].main_grad[:4] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    bench.step_loops(model)
    assert int(bench.count_zeros_loop(model)) == 3 + 4 + 0
    dense, sharded = bench.params_norm_loop(model)
    assert dense == [] and [id(t) for t in sharded] == [id(m) for m in model.mains]


def test_the_bench_prints_every_part(capsys):
    bench.main(["--repeats", "1", "--calls", "2", "--tensors", "4"])
    table = capsys.readouterr().out.splitlines()
    assert table[2] == "|---|---|---|---|---|"
    names = [line.split(" | ")[0].lstrip("| ") for line in table[3:]]
    assert names[0] == "torch Linear (the unit)" and len(names) == 13
    assert sum(name.endswith("x 4 tensors") for name in names) == 6


def test_the_ring_replica_calls_the_attention_once_a_step_each_way():
    # AttnFuncWithCPAndKVP2P at CP 2: two ring steps, one fused-attention call each, forward and backward
    from torch.utils._python_dispatch import TorchDispatchMode

    bh, cp = load_script("bench_host"), load_script("bench_host_cp")

    class Calls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    for rank in range(cp.CP):
        block = bh.Block(cp.RingAttention(rank))
        x = torch.randn(bh.S, bh.B, bh.H, requires_grad=True)
        with Calls() as fwd:
            out = block(x)
        with Calls() as bwd:
            out.backward(torch.ones_like(out))
        assert sum("flash_attention_for_cpu.default" in n for n in fwd.names) == 2
        assert sum("flash_attention_for_cpu_backward" in n for n in bwd.names) == 2
        plain = bh.count_ops(bh.Block(), lambda: torch.randn(bh.S, bh.B, bh.H, requires_grad=True))
        assert len(fwd.names) > plain[0] and len(bwd.names) > plain[1]  # the ring's slices, corrections, copies


MOE = replace(LLAMA, name="tiny-moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
MLA = replace(LLAMA, name="tiny-mla", num_layers=2, num_kv_heads=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
              num_shared_experts=1, shared_intermediate_size=32, dense_layers=(0,), kv_lora_rank=16, q_lora_rank=24,
              qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16)


def test_moe_and_latent_blocks_tensors_are_counted_as_megatron_core_builds_them():
    profile, layers = _layers(MOE)
    block = next(layer for layer in layers if layer.kind == "moe_block")
    # attention: linear_qkv (norm weight + weight), linear_proj: 3; MoE: pre_mlp_layernorm, the router's weight,
    # 8 local experts' fc1 and fc2 (TE GroupedLinear's weight0..weight7 each): 1 + 1 + 16; GEMM weights 2 + 16
    assert hosttime.param_tensors(block, profile, _setup()) == 21
    assert hosttime.param_tensors(block, profile, _setup(dp=4, ep=4)) == 3 + 1 + 1 + 4  # 2 local experts
    fused, unfused = _setup(), _setup(unfused_grad_accumulation=True)
    assert hosttime.grad_hook_ms(block, profile, fused) == pytest.approx((3 * 0.18 + 18 * 0.04) * CALL)
    assert hosttime.grad_hook_ms(block, profile, unfused) == pytest.approx(21 * 0.18 * CALL)
    profile, layers = _layers(MLA)
    dense, moe = (next(layer for layer in layers if layer.kind == kind) for kind in ("decoder_block", "moe_block"))
    # latent attention: input_layernorm, q_down, q_up (+ its q_a norm), kv_down, kv_up (+ its kv_a norm), proj: 8,
    # 5 GEMM weights; the dense MLP: fc1 (norm weight + weight), fc2: 3; the MoE: norm, router, 16 experts' weights,
    # the shared experts' fc1 and fc2
    assert hosttime.param_tensors(dense, profile, _setup()) == 11
    assert hosttime.param_tensors(moe, profile, _setup()) == 8 + 1 + 1 + 16 + 2
    assert hosttime.grad_hook_ms(moe, profile, _setup()) == pytest.approx((5 * 0.18 + 23 * 0.04) * CALL)
    no_q_rank, layers = _layers(replace(MLA, q_lora_rank=0))
    dense = next(layer for layer in layers if layer.kind == "decoder_block")
    assert hosttime.param_tensors(dense, no_q_rank, _setup()) == 6 + 3  # linear_q_proj, no q_a norm
