"""Context parallelism (issue 33/35): each rank's seq/cp tokens in the analytic profile, the runtime's
K/V exchange in time and memory (planner/cost/contextparallel.py), and --cp on the command line."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from planner.cli import cli
from planner.cost import comm, contextparallel
from planner.cost.layers import ExchangeCost, layer_costs
from planner.errors import UserError
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef, TrainSetup

H100 = archs.gpu("h100")
# h 64, 4 heads of 16 (Q 64 wide), 2 K/V heads (K and V 32 wide each), SwiGLU 160
TINY = archs.Arch(name="tiny-llama", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                  num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=32)
REF = FileRef(file="arch:test", sha256="0" * 64)


def _profile(cp: int, seq_len: int = 32):
    return analytic.analytic_profile(TINY, Shape(seq_len=seq_len, micro_batch_size=1, cp=cp), gpu=H100, model=REF)


# ---------------------------------------------------------------- memory: the rank's tokens


def test_a_blocks_activations_by_hand_at_cp_1_and_2():
    # per token, bf16: two norm inputs 2 x 128 and their fp32 1/rms 2 x 4, the Q/K/V input 128 and the
    # MLP input 128, Q 128, K 64, V 64, flash's logsumexp 4 x 4 heads, the output 128, SwiGLU's four
    # 160-wide tensors 4 x 320: 2,200 B a token. cp 1 holds 32 tokens, cp 2 each rank's 16.
    per_token = 2 * 128 + 2 * 4 + 128 + 128 + 128 + 64 + 64 + 16 + 128 + 4 * 320
    assert per_token == 2200
    assert _profile(1).layers[1].act_bytes == 32 * per_token == 70400
    assert _profile(2).layers[1].act_bytes == 16 * per_token == 35200


def test_the_loss_and_the_batch_scale_with_the_ranks_tokens():
    whole, half = _profile(1), _profile(2)
    assert half.loss_bytes == 16 * 128 * 4 + 4 and whole.loss_bytes == 32 * 128 * 4 + 4  # fp32 softmax + the loss
    assert half.batch_input_bytes == 16 * 8  # int64 ids of the rank's tokens
    assert half.layers[1].param_count == whole.layers[1].param_count  # weights are not split by CP


def test_the_exchange_record_holds_the_ranks_q_and_kv():
    exchange = _profile(2).layers[1].context_parallel
    assert (exchange.ranks, exchange.q_bytes, exchange.kv_bytes) == (2, 16 * 64 * 2, 16 * (32 + 32) * 2)
    assert exchange.attention_fwd_ms > 0 and exchange.attention_bwd_ms > exchange.attention_fwd_ms
    assert _profile(1).layers[1].context_parallel is None


def test_attention_flops_per_rank_are_its_queries_against_the_whole_sequence():
    from planner.profiler.formulas import attention_flops

    s = 32
    whole, half = Shape(seq_len=s, micro_batch_size=1), Shape(seq_len=s, micro_batch_size=1, cp=2)
    projections = lambda tokens: 2 * tokens * 64 * (2 * 64 + 2 * 32)  # noqa: E731
    assert attention_flops(TINY, whole) == projections(32) + 4 * 32 * s * 64
    assert attention_flops(TINY, half) == projections(16) + 4 * 16 * s * 64  # (s/cp) x s, balanced


@pytest.mark.parametrize("shape, named", [
    (Shape(seq_len=30, micro_batch_size=1, cp=2), "multiple of 4"),
    (Shape(seq_len=32, micro_batch_size=1, cp=2, attention="eager"), "eager"),
    (Shape(seq_len=4, micro_batch_size=1, cp=2, tp=4, sp=True), "--tp divides"),
])
def test_a_split_the_frameworks_refuse_is_refused(shape, named):
    with pytest.raises(UserError, match=named):
        analytic.analytic_profile(TINY, shape, gpu=H100, model=REF)


# ---------------------------------------------------------------- time: the exchange by hand

LINK = comm.Link(100.0)  # 100 GB/s, no latency: 1e8 bytes a millisecond
RING = ExchangeCost(ranks=4, q_bytes=10**8, kv_bytes=10**8, attention_fwd_ms=2.0, attention_bwd_ms=4.0)


def test_the_p2p_ring_by_hand():
    # forward: 3 sends of K/V (1 ms) each beside a step of 2 / 4 = 0.5 ms: 3 x 0.5 exposed
    assert contextparallel.pass_exposed_ms(RING, "forward", "p2p", LINK) == pytest.approx(1.5)
    # backward: 3 sends of K/V with dK/dV (2 ms) beside steps of 1 ms, then the last dK/dV home (1 ms)
    assert contextparallel.pass_exposed_ms(RING, "backward", "p2p", LINK) == pytest.approx(3 * 1.0 + 1.0)


def test_the_all_gather_ring_by_hand():
    # forward: all-gather of 4 x 1e8 bytes over 4 ranks moves 3e8 a rank (3 ms), hidden behind step 0 (0.5)
    assert contextparallel.pass_exposed_ms(RING, "forward", "allgather", LINK) == pytest.approx(2.5)
    # backward: the gather again beside step 0 (1 ms): 2; fp32 dK/dV (2e8, 2 ms) passed after each of the
    # 4 steps, 3 of them beside the next step (1 ms exposed each), the last waited for whole (2)
    assert contextparallel.pass_exposed_ms(RING, "backward", "allgather", LINK) == pytest.approx(2 + 3 * 1 + 2)


def _cp_setup(runtime: str, gb_per_s: float, **fields) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**40], precision="bf16-mixed",
                      runtime=runtime, context_parallel=4, cp=4, cp_gb_per_s=gb_per_s, **fields)


def test_a_layers_exchange_reads_the_runtimes_ring_and_reruns_under_full_recompute():
    import dataclasses

    block = dataclasses.replace(layer_costs(_profile(1))[1], context_parallel=RING)
    megatron, titan = _cp_setup("megatron", 100.0), _cp_setup("torchtitan", 100.0)
    assert contextparallel.exchange_ms(block, 0, megatron) == pytest.approx(1.5 + 4.0)
    assert contextparallel.exchange_ms(block, 1, megatron) == pytest.approx(2 * 1.5 + 4.0)  # the forward rerun
    assert contextparallel.exchange_ms(block, 0, titan) == pytest.approx(2.5 + 7.0)
    # --cp-comm overrides the runtime's default
    assert contextparallel.exchange_ms(block, 0, _cp_setup("torchtitan", 100.0, cp_comm="p2p")) == \
        pytest.approx(1.5 + 4.0)
    # no link (a cpu profile): not charged
    assert contextparallel.exchange_ms(block, 0, _cp_setup("megatron", None)) == 0.0


def test_a_compiled_full_recompute_gathers_kv_once_for_the_rerun_and_the_backward():
    import dataclasses

    block = dataclasses.replace(layer_costs(_profile(1))[1], context_parallel=RING)
    compiled, eager = _cp_setup("torchtitan", 100.0, compile=True), _cp_setup("torchtitan", 100.0)
    # the forward's gather (2.5 exposed) and the rerun's again; the backward only passes fp32 dK/dV (3 x 1 + 2)
    assert contextparallel.exchange_ms(block, 1, compiled) == pytest.approx(2 * 2.5 + (3 + 2))
    assert contextparallel.exchange_ms(block, 1, eager) == pytest.approx(2 * 2.5 + (2 + 3 + 2))
    # without the rerun the backward gathers for itself, compiled or not
    assert contextparallel.exchange_ms(block, 0, compiled) == pytest.approx(2.5 + (2 + 3 + 2))
    # Megatron-LM's p2p ring has no gather to reuse
    assert contextparallel.exchange_ms(block, 1, _cp_setup("megatron", 100.0, compile=True)) == \
        pytest.approx(2 * 1.5 + 4.0)


def test_torchtitan_9dec370s_compiled_ring_waits_for_every_exchange_where_it_issues_it():
    import dataclasses

    mha = dataclasses.replace(RING, q_bytes=RING.kv_bytes // 2)  # K, V each as wide as Q: no repeat_kv
    block = dataclasses.replace(layer_costs(_profile(1))[1], context_parallel=mha)
    # forward: the all-gather of 4 x 1e8 over 4 ranks moves 3e8 a rank (3 ms), none of it behind step 0
    assert contextparallel.pass_exposed_ms(RING, "forward", "allgather", LINK, waited=True) == pytest.approx(3)
    # backward: the gather again (3) and each of the 4 fp32 dK/dV passes (2e8, 2 ms) whole
    assert contextparallel.pass_exposed_ms(RING, "backward", "allgather", LINK, waited=True) == pytest.approx(3 + 8)
    compiled = _cp_setup("torchtitan", 100.0, compile=True, runtime_version="9dec370")
    assert contextparallel.waits_at_issue(compiled.training)
    # the forward's gather, the rerun's (which the backward reuses), the 4 dK/dV passes
    assert contextparallel.exchange_ms(block, 1, compiled) == pytest.approx(2 * 3 + 8)
    assert contextparallel.exchange_ms(block, 0, compiled) == pytest.approx(3 + (3 + 8))
    # eager at 9dec370, and compiled at a version not read for it, keep the overlap
    eager = _cp_setup("torchtitan", 100.0, runtime_version="9dec370")
    assert not contextparallel.waits_at_issue(eager.training)
    assert contextparallel.exchange_ms(block, 1, eager) == pytest.approx(2 * 2.5 + (2 + 3 + 2))
    assert contextparallel.exchange_ms(block, 1, _cp_setup("torchtitan", 100.0, compile=True)) == \
        pytest.approx(2 * 2.5 + (3 + 2))
    # Megatron-LM's p2p ring (Transformer Engine's, not compiled) as before
    assert contextparallel.exchange_ms(block, 1, _cp_setup("megatron", 100.0, compile=True)) == \
        pytest.approx(2 * 1.5 + 4.0)


def test_torchtitans_repeated_kv_heads_widen_what_its_ring_moves_and_holds():
    import dataclasses

    block = dataclasses.replace(layer_costs(_profile(1))[1], context_parallel=RING)
    # RING: K and V together as wide as Q, i.e. 2 query heads a K/V head; torchtitan 9dec370's repeat_kv
    # makes each 1e8 wide: K/V 2e8 bytes
    old = _cp_setup("torchtitan", 100.0, runtime_version="9dec370")
    assert contextparallel.as_exchanged(RING, old.training).kv_bytes == 2 * 10**8
    # forward: the all-gather of 4 x 2e8 moves 6e8 (6 ms) beside step 0 (0.5): 5.5; backward: the gather
    # again beside 1 ms (5), fp32 dK/dV of 4e8 (4 ms) beside 3 steps of 1 ms (3 x 3) and the last (4)
    assert contextparallel.exchange_ms(block, 0, old) == pytest.approx(5.5 + (5 + 9 + 4))
    # b5bcd76c passes enable_gqa, Megatron's TE takes the query groups: K/V at their own heads
    assert contextparallel.as_exchanged(RING, _cp_setup("torchtitan", 100.0).training) == RING
    assert contextparallel.as_exchanged(RING, _cp_setup("megatron", 100.0).training) == RING
    # the buffers hold the repeated K/V: the all-gather ring's forward (cp + 1) KV + 3 Q at KV 2e8
    setup = dataclasses.replace(block, context_parallel=ExchangeCost(ranks=4, q_bytes=10**6, kv_bytes=10**6,
                                                                     attention_fwd_ms=1.0, attention_bwd_ms=1.0))
    forward, backward = contextparallel.buffer_bytes(ExchangeCost(4, 10**6, 2 * 10**6, 1.0, 1.0), "allgather")
    assert contextparallel.extra_bytes(setup, old) == \
        max(0, forward - setup.transient_bytes, backward + setup.output_bytes - setup.transient_bytes)
    new = _cp_setup("torchtitan", 100.0)
    # the backward's buffers set it (planner/cost/cpring.py's eager ring at step 1's flash call, where Q is as wide
    # as K or half K with V): the gathered cp, the concatenation 1, step 0's dK, dV 1 and step 1's 1/2, the fp32 dK,
    # dV 2, the fp32 buffers sent and received 4 (Q's part, flash's fp32 dQ accumulator among it, is the same): 12.5
    # K/V, each 1e6 wider
    assert contextparallel.extra_bytes(setup, old) - contextparallel.extra_bytes(setup, new) == 12.5 * 10**6
    # wider K/V than Q (latent attention's up-projected K and V, or MHA): no repeat
    wide = ExchangeCost(ranks=4, q_bytes=10, kv_bytes=25, attention_fwd_ms=1.0, attention_bwd_ms=1.0)
    assert contextparallel.as_exchanged(wide, old.training) == wide


def test_torchs_ring_merge_and_fp32_gradients_by_hand():
    # cp 4, O 1 element (2 bytes), K with V 2 elements (4 bytes): the busiest rank runs 3 full merges
    ring = ExchangeCost(ranks=4, q_bytes=2, kv_bytes=4, attention_fwd_ms=1.0, attention_bwd_ms=1.0)
    # compiled: inductor's count (COMPILED_RING_BYTES), per element of O, K and V over 3 (here 1): the forward
    # 475/64 + 3 x 717/64 = 41.03125, inductor's CP 4 forward graph on its busiest rank (scripts/cp_ring_bytes.py)
    assert contextparallel.ring_bytes(ring, "forward", compiled=True) == 41.03125
    # eager: each merge 38 (cast 6, out - block_out 12, x sigmoid 8, out - 12); .contiguous() 4 and 3 concatenations
    assert contextparallel.ring_bytes(ring, "forward", compiled=False) == 12 + 3 * 38 + (4 + 3 * 4) * 2
    # backward compiled: the CP 4 backward graph's 224.3125 (the rerun forward's ring, then the backward's) less the forward
    assert contextparallel.ring_bytes(ring, "backward", compiled=True) == 224.3125 - 41.03125
    # per later step: forward 717/64, backward graph 4304/64 (CP 2 -> CP 4 adds two steps: 89.8125 -> 224.3125)
    cp2 = ExchangeCost(ranks=2, q_bytes=2, kv_bytes=4, attention_fwd_ms=1.0, attention_bwd_ms=1.0)
    assert contextparallel.ring_bytes(cp2, "forward", compiled=True) == 18.625
    assert contextparallel.ring_bytes(cp2, "forward", compiled=True) + \
        contextparallel.ring_bytes(cp2, "backward", compiled=True) == 89.8125
    # eager: dQ zeros 4, += 10 x 4 steps, back 6; dK/dV zeros 4, .contiguous() 4, 3 concatenations 12,
    # step 0's += 10 and send 8, 3 x (half add 5 + whole 8 + send 8), back 6
    assert contextparallel.ring_bytes(ring, "backward", compiled=False) == (4 + 40 + 6) + (4 + 4 + 12 + 18 + 63 + 6) * 2


def test_the_rings_memory_bound_time_reads_the_profiles_rate_and_the_compile():
    import dataclasses

    profile = _profile(1)
    ring = ExchangeCost(ranks=4, q_bytes=2 * 10**9, kv_bytes=2 * 10**9, attention_fwd_ms=1.0, attention_bwd_ms=1.0)
    block = dataclasses.replace(layer_costs(profile)[1], context_parallel=ring)
    rates = profile.assumptions["membound_tbps"]
    eager = _cp_setup("torchtitan", 100.0, runtime_version="9dec370")
    compiled = _cp_setup("torchtitan", 100.0, runtime_version="9dec370", compile=True)
    # K/V as wide as Q: repeat_kv doubles them at 9dec370 (4e9 bytes, 2e9 elements); O 1e9 elements
    fwd = (12 + 3 * 38) * 10**9 + (4 + 3 * 4) * 2 * 10**9
    bwd = (4 + 40 + 6) * 10**9 + (4 + 4 + 12 + 18 + 63 + 6) * 2 * 10**9
    assert contextparallel.ring_membound_ms(block, 0, profile, eager) == pytest.approx((fwd + bwd) / (rates["eager"] * 1e9))
    assert contextparallel.ring_membound_ms(block, 1, profile, eager) == \
        pytest.approx((2 * fwd + bwd) / (rates["eager"] * 1e9))  # the forward rerun
    fwd, bwd = 41.03125 * 10**9, (224.3125 - 41.03125) * 10**9  # inductor's count a 1e9 O, K and V elements over 3
    assert contextparallel.ring_membound_ms(block, 0, profile, compiled) == pytest.approx((fwd + bwd) / (rates["fused"] * 1e9))
    # Transformer Engine's p2p ring at the eager rate, K/V at their own heads (no repeat): O 2e9 B, KV 2e9 B at CP 4
    fwd = 2 * 2 + 2 * 2 + 3 * 2 * 3  # GB: the K/V concatenation, the first output's scale, three corrections
    bwd = 2 * 2 + 2 * 2 + 3 * 2 * 3 + 2 + 1.5 * 2 * 2 + 3 * 2  # the K/V copy, dq, dK/dV's halves and the diagonal
    megatron, elementwise = _cp_setup("megatron", 100.0), rates["by_class"]["elementwise"]
    assert elementwise == pytest.approx(0.922 * 3.35)  # the H100's elementwise class (membound_published.py)
    assert contextparallel.ring_membound_ms(block, 0, profile, megatron) == pytest.approx((fwd + bwd) / elementwise)
    assert contextparallel.ring_membound_ms(block, 1, profile, megatron) == \
        pytest.approx((2 * fwd + bwd) / elementwise)
    # a profile without classed rates: the eager mean
    plain = SimpleNamespace(assumptions={"membound_tbps": {"eager": rates["eager"]}})
    assert contextparallel.ring_membound_ms(block, 0, plain, megatron) == pytest.approx((fwd + bwd) / rates["eager"])
    # each count is its library's ring: torch's alltoall rotation (torchtitan --cp-comm p2p) runs none of TE's copies,
    # and TE's all-gather (megatron --cp-comm allgather) none of torch's merges; neither's ops read: nothing charged
    assert contextparallel.ring_membound_ms(block, 0, profile, _cp_setup("torchtitan", 100.0, cp_comm="p2p",
                                                                         runtime_version="9dec370")) == 0.0
    assert contextparallel.ring_membound_ms(block, 0, profile, _cp_setup("megatron", 100.0, cp_comm="allgather")) == 0.0


def test_transformer_engines_p2p_ring_bytes_by_hand():
    # TE v2.9 AttnFuncWithCPAndKVP2P on rank cp - 1, causal, bf16: O 100 B (as wide as Q), K and V 10 B together
    cp2 = ExchangeCost(ranks=2, q_bytes=100, kv_bytes=10, attention_fwd_ms=1.0, attention_bwd_ms=1.0)
    # forward: torch.cat(k, v) read + written 20; out_correction_init reads step 0's output, writes the output 200;
    # step 1's correction reads the output and the step's, writes the output 300
    assert contextparallel.p2p_ring_bytes(cp2, "forward") == 20 + 200 + 300
    # backward: K/V into the send buffer 20; dq.copy_ 200, dq.add_ 300; dk[0], dv[0] copied from step 0's
    # half-length gradients (5 read, 5 written) 10; the diagonal's dk, dv added at the last step 30
    assert contextparallel.p2p_ring_bytes(cp2, "backward") == 20 + 200 + 300 + 10 + 30
    # CP 4: two more middle steps, each an output correction (300) forward, a dq add (300) and a half dK/dV add
    # (5 + 5 read, 5 written) backward
    cp4 = ExchangeCost(ranks=4, q_bytes=100, kv_bytes=10, attention_fwd_ms=1.0, attention_bwd_ms=1.0)
    assert contextparallel.p2p_ring_bytes(cp4, "forward") == 520 + 2 * 300
    assert contextparallel.p2p_ring_bytes(cp4, "backward") == 560 + 2 * 300 + 2 * 15


def test_the_cp_link_is_nvlink_inside_a_node_and_the_network_across(tmp_path):
    from planner.commands import comm_setup
    from planner.commands.setup_options import DataParallelOptions

    def link(tp: int, cp: int) -> float:
        profile = analytic.analytic_profile(archs.arch("llama3-8b"), Shape(seq_len=1024, micro_batch_size=1, tp=tp, cp=cp),
                                            gpu=H100, model=REF)
        return comm_setup.comm_fields(profile, DataParallelOptions(dp=cp), runtime="megatron")["cp_gb_per_s"]

    # tp 4 x cp 2 fits a node of 8: nccl-tests' in-node figure; tp 8 x cp 2 spans two: one 400 Gb/s NIC a GPU,
    # at NCCL's bus bandwidth over it (48 of its 50 GB/s)
    assert link(4, 2) == pytest.approx(H100.node_collective_gb_per_s)
    assert link(8, 2) == pytest.approx(48.0 * H100.nics_per_gpu) == pytest.approx(H100.network_collective_rate)
    # by hand over each: a 1e8-byte K/V send at 50 GB/s is 2 ms plus NCCL's latency
    network = comm.network_link(50.0, 1)
    assert comm.send_ms(10**8, network) == pytest.approx(8.4e-3 + 14.0e-3 + 2.0)


# ---------------------------------------------------------------- memory: the exchange's buffers


def test_the_rings_buffers_by_hand():
    q, kv = 10, 100
    ring = ExchangeCost(ranks=4, q_bytes=q, kv_bytes=kv, attention_fwd_ms=1.0, attention_bwd_ms=1.0)
    # TE p2p: forward 3 received K/V + 4 steps' outputs + the merged output, bf16 as each step's (TE v2.9's
    # flash_attn_fwd_out_correction_init returns out_corrected.to(out_init_step.dtype), framework-facts §542: one O,
    # not an fp32 2 O); backward dq, [kv, dkv] x 2, a step's grads
    assert contextparallel.buffer_bytes(ring, "p2p") == (3 * kv + 4 * q + q, q + 4 * kv + q + kv) == (350, 520)
    # torch all-gather, eager (planner/cost/cpring.py's programs' peaks): forward before step 1's wait, the K, V
    # copies, their concatenation, the gathered K/V, step 0's output and its fp32 cast; backward at a middle step's
    # new received buffer: fp32 dQ, the gathered K/V, the concatenation, a step's dQ and half-width dK, dV, the fp32
    # partial updates of dK, dV, the fp32 buffer sent, the received one and the next
    assert contextparallel.buffer_bytes(ring, "allgather") == (
        kv + kv + 4 * kv + q + 2 * q, 2 * q + 4 * kv + kv + q + kv // 2 + 2 * kv + 2 * kv + 2 * kv + 2 * kv)


def test_the_buffers_count_only_beyond_the_layers_own_transient():
    import dataclasses

    block = layer_costs(_profile(1))[1]
    setup = _cp_setup("megatron", 100.0)
    small = ExchangeCost(ranks=4, q_bytes=1, kv_bytes=1, attention_fwd_ms=1.0, attention_bwd_ms=1.0)
    assert contextparallel.extra_bytes(dataclasses.replace(block, context_parallel=small), setup) == 0
    big = ExchangeCost(ranks=4, q_bytes=10**6, kv_bytes=10**6, attention_fwd_ms=1.0, attention_bwd_ms=1.0)
    # p2p at cp 4: forward 3 KV + 5 Q (4 steps' outputs and the bf16 merged one) = 8 MB over backward 2 Q + 5 KV + the
    # output gradient
    forward = 3 * 10**6 + 5 * 10**6
    assert forward > 2 * 10**6 + 5 * 10**6 + block.output_bytes
    assert contextparallel.extra_bytes(dataclasses.replace(block, context_parallel=big), setup) == \
        forward - block.transient_bytes


# ---------------------------------------------------------------- the command line


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cp")
    found = {}
    for cp in (1, 2):
        out = folder / f"l8_cp{cp}.json"
        result = CliRunner().invoke(cli, ["profile", "--arch", "llama3-8b", "--seq-len", "4096", "--cp", str(cp),
                                          "--micro-batch-size", "1", "--gpu", "h100", "--out", str(out)])
        assert result.exit_code == 0, result.output
        found[cp] = out
    return found


def _evaluate(path, *extra):
    return CliRunner().invoke(cli, ["evaluate", "--profile", str(path), "--layers-per-stage", "34",
                                    "--ckpt-per-stage", "0", "--microbatches", "1", "--mem", "80GB", "--dp", "2",
                                    "--zero", "3", "--precision", "bf16-mixed", "--json", *extra])


def _hand(result) -> dict:
    assert result.exit_code == 0, result.output
    found, _ = json.JSONDecoder().raw_decode(result.output[result.output.index("{"):])
    return found["hand"]


def test_evaluate_at_cp_2_halves_the_activations_and_shards_over_dp_x_cp(profiles):
    whole = _hand(_evaluate(profiles[1], "--runtime", "torchtitan"))
    split = _hand(_evaluate(profiles[2], "--runtime", "torchtitan", "--cp", "2"))
    assert split["stages"][0]["peak_bytes"] < 0.6 * whole["stages"][0]["peak_bytes"]
    # the profile's degree is the default
    assert _hand(_evaluate(profiles[2], "--runtime", "torchtitan")) == split


@pytest.mark.parametrize("which, flags, named", [
    (2, ["--cp", "4", "--runtime", "megatron"], "made at context parallelism 2"),
    (1, ["--cp", "2", "--runtime", "megatron"], "made at context parallelism 1"),
    (2, ["--runtime", "ckplan"], "choose --runtime megatron or torchtitan"),
    (1, ["--cp-comm", "p2p", "--runtime", "megatron"], "--cp is 1"),
])
def test_cp_the_setup_cannot_take_is_refused_in_one_sentence(profiles, which, flags, named):
    result = _evaluate(profiles[which], *flags)
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert named in result.output


def test_a_fake_or_measured_profile_takes_no_cp(tmp_path):
    """They run the model file's whole sequence on one device: --cp is an analytic profile's."""
    config = tmp_path / "config.json"
    config.write_text("{}")
    result = CliRunner().invoke(cli, ["profile", "--fake", "--hf-config", str(config), "--cp", "2"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "--cp applies to --arch/--arch-config profiles only" in result.output


def test_evaluate_refuses_cp_on_a_profile_not_analytic(profiles, tmp_path):
    data = json.loads(profiles[1].read_text())
    data["source"] = "fake"
    fake = tmp_path / "fake.json"
    fake.write_text(json.dumps(data))
    result = _evaluate(fake, "--cp", "2", "--runtime", "megatron")
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "runs the model file's whole sequence on one device" in result.output


def test_evaluate_from_megatron_reads_cp_and_scores_it(tmp_path):
    base = ("--num-layers: 4\n--hidden-size: 256\n--num-attention-heads: 8\n--seq-length: 1024\n--vocab-size: 1024\n"
            "--swiglu: true\n--bf16: true\n--micro-batch-size: 1\n--global-batch-size: 8\n"
            "--use-distributed-optimizer: true\n")

    def scored(extra: str, gpus: int) -> dict:
        path = tmp_path / "args.yaml"
        path.write_text(base + extra)
        result = CliRunner().invoke(cli, ["evaluate", "--from-megatron", str(path), "--gpus", str(gpus), "--gpu",
                                          "h100", "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.output[result.output.index("{"):])

    plain = scored("", 4)
    split = scored("--context-parallel-size: 2\n", 8)
    assert split["cp"] == 2 and not any(s["name"] == "--context-parallel-size" and s["status"] != "modelled"
                                        for s in split.get("settings", []))
    # the same 4 data-parallel replicas, each sequence over 2 ranks: less activation memory a rank
    assert split["ranks"][0]["peak_bytes"] < plain["ranks"][0]["peak_bytes"]


# ---------------------------------------------------------------- search and exports


def test_search_lists_cp_degrees_that_divide_the_sequence_into_2cp_chunks():
    from planner.solve.degrees import JobShape, context_choices, enumerate_degrees

    # 12 tokens: cp 2 cuts 4 chunks of 3; cp 4 would need 8 chunks and cp 8 16: pruned
    short = JobShape(gpus=8, gpus_per_node=8, global_batch=2, seq_len=12, num_layers=4, tp_ok=(1, 4),
                     cp_ok=(1, 2, 4, 8))
    assert context_choices(short, 1, False) == [1, 2]
    # under SP each rank's 12 / 2 = 6 tokens do not split over tp 4: cp 2 pruned there
    assert context_choices(short, 4, True) == [1]
    found = enumerate_degrees(short)
    assert {d.cp for d in found} == {1, 2}
    assert all(d.tp * d.cp * d.pp * d.dp == 8 for d in found)
    # 32 tokens: cp 4 (8 chunks of 4) too; ZeRO groups take whole cp groups: at tp 1, cp 4, dp 2 the
    # groups are 4 ranks or all 8; at dp 1 ZeRO still shards over the cp ranks
    long = JobShape(gpus=8, gpus_per_node=8, global_batch=8, seq_len=32, num_layers=4, tp_ok=(1, 2),
                    cp_ok=(1, 2, 4, 8))
    found = enumerate_degrees(long)
    assert {d.cp for d in found} == {1, 2, 4, 8}  # cp 8: 16 chunks of 2, at tp 1 only (8 GPUs)
    assert {d.tp for d in found if d.cp == 8} == {1}
    assert {d.shard_group for d in found if (d.tp, d.cp, d.pp, d.dp) == (1, 4, 1, 2) and d.zero} == {4, None}
    assert any(d.zero == 3 for d in found if (d.tp, d.cp, d.pp, d.dp) == (2, 4, 1, 1))
    assert "cp4" in next(d for d in found if d.cp == 4).label()


def test_search_without_a_cp_runtime_lists_no_cp():
    from planner.solve.degrees import JobShape, enumerate_degrees

    job = JobShape(gpus=8, gpus_per_node=8, global_batch=8, seq_len=32, num_layers=4, tp_ok=(1, 2))
    assert {d.cp for d in enumerate_degrees(job)} == {1}


def test_a_searched_cp_setup_counts_the_cp_ranks_as_weight_replicas():
    from planner.solve import jobsearch
    from planner.solve.degrees import Degrees

    profile = _profile(2)
    degrees = Degrees(tp=1, sp=False, pp=1, dp=2, micro_batch_size=1, microbatches=1, zero=3, shard_group=None, cp=2)
    setup = jobsearch.job_setup(profile, degrees, jobsearch.JobOptions(mem_cap_bytes=2**36, gpus_per_node=8,
                                                                       runtime="megatron"))
    assert (setup.data_parallel.dp, setup.training.context_parallel, setup.comm.cp) == (4, 2, 2)
    assert setup.comm.cp_gb_per_s == pytest.approx(H100.node_collective_gb_per_s)  # 2 ranks in a node


def test_search_cli_ranks_cp_configurations(tmp_path):
    # 1F1B only: the interleaved configurations' MILP solves were 9/10 of the test's time and ran into its time limit;
    # cp is enumerated whatever the schedule (§66.suitetime)
    out = tmp_path / "plan.yaml"
    result = CliRunner().invoke(cli, ["search", "--arch", "llama3-8b", "--gpus", "8", "--global-batch", "2",
                                      "--seq-len", "32768", "--runtime", "torchtitan", "--json", "--out", str(out),
                                      "--time-limit", "60", "--schedules", "1F1B"])
    assert result.exit_code == 0, result.output
    assert " cp" in result.output  # a CP configuration among those ranked
    ranking = json.loads(result.output[result.output.index("{"):])
    assert ranking["counts"]["complete"] and 2 in [config["degrees"]["cp"] for config in ranking["ranked"]]


def test_exports_write_cp_where_the_framework_takes_it(profiles, tmp_path):
    from planner.emit import megatron, torchtitan
    from planner.schema import Plan

    plan_path = tmp_path / "plan.yaml"
    result = CliRunner().invoke(cli, ["solve", "--profile", str(profiles[2]), "--stages", "1", "--microbatches", "2",
                                      "--dp", "2", "--zero", "1", "--precision", "bf16-mixed", "--runtime", "megatron",
                                      "--mem", "200GB", "--out", str(plan_path)])
    assert result.exit_code == 0, result.output
    from planner import io

    plan, profile = io.load_plan(plan_path), io.load_profile(profiles[2])
    assert isinstance(plan, Plan) and plan.setup.training.context_parallel == 2
    text = megatron.export(plan, profile, plan_file=str(plan_path)).text
    assert "--context-parallel-size 2" in text
    assert "--global-batch-size 4" in text  # 2 microbatches x 1 x dp 2: the cp ranks share their replica's batch
    titan = torchtitan.export(plan, profile, plan_file=str(plan_path)).text
    assert "context_parallel_degree = 2" in titan


def test_the_heads_all_to_all_by_hand():
    # Q 1e8 and K/V 1e8 a rank, 4 ranks, 100 GB/s: each all-to-all moves 3/4 of its tensor, none hidden
    a2a = 2 * 0.75 * 1.0 + 2 * 0.75 * 0.5  # Q and O; K and V (5e7 each)
    assert contextparallel.pass_exposed_ms(RING, "forward", "a2a", LINK) == pytest.approx(a2a)
    assert contextparallel.pass_exposed_ms(RING, "backward", "a2a", LINK) == pytest.approx(a2a)
    q, kv = 10, 100
    ring = ExchangeCost(ranks=4, q_bytes=q, kv_bytes=kv, attention_fwd_ms=1.0, attention_bwd_ms=1.0)
    assert contextparallel.buffer_bytes(ring, "a2a") == (2 * (q + kv) + 2 * q, 2 * q + 3 * (q + kv))


def test_a2a_needs_cp_to_divide_the_heads(profiles):
    # llama3-8b: 32 Q heads, 8 K/V heads; cp 2 divides both
    assert _hand(_evaluate(profiles[2], "--runtime", "megatron", "--cp-comm", "a2a"))
    from planner.commands.training_settings import _a2a_heads
    from planner.io import load_profile

    profile = load_profile(profiles[2])
    assert _a2a_heads(profile, "a2a", 2) == []
    assert "does not divide" in _a2a_heads(profile, "a2a", 3)[0]  # 8 K/V heads over 3


def test_gpus_per_node_counts_the_cp_ranks_in_the_data_parallel_groups():
    from types import SimpleNamespace

    from planner.commands.evaluate_config import _with_node
    from planner.commands.setup_options import DataParallelOptions

    job = SimpleNamespace(tp=1, cp=2)
    notes: list[str] = []
    # 4 replicas x 2 cp ranks = 8 ranks: past a node of 4 (two data-parallel ranks a node, two NICs' busbw: 2 x 48,
    # planner/models/network_rate.py), within a node of 8
    across = _with_node(DataParallelOptions(dp=4, zero=3), job, H100, 4, notes)
    inside = _with_node(DataParallelOptions(dp=4, zero=3), job, H100, 8, notes)
    assert across.shard_bandwidth == 2 * H100.network_collective_rate == 96.0 and inside.shard_bandwidth == H100.node_collective_gb_per_s
    assert "x CP 2" in notes[0]
