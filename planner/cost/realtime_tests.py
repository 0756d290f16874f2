"""Megatron-LM's --test-mode: the realtime checks in each attention forward (docs/framework-facts.md §881).

Megatron-core's `SelfAttention.get_query_key_value_tensors` calls `run_realtime_tests` after the q/k norms when
`config.test_mode` is set (megatron/core/transformer/attention.py 1938-1939, 1753-1822, Megatron-LM d98e8a64 and
93ebf8d7; nothing else in megatron/ reads test_mode but the fused single-QKV rope's gate, 1364, which
--qk-layernorm closes anyway). With --qk-layernorm, per attention forward (a full recompute's rerun too):

    torch.stack of the four norm tensors (q/k weight and bias, head_dim each), then for the DP group and the TP group:
    a list of group-size torch.empty_like, torch.distributed.all_gather over the group (NCCL), and for each rank's
    entry torch.unbind and four `assert torch.all(src == tgt)`: bool() of a CUDA tensor, .item(), a copy to the host
    and a stream synchronize.

Each assert waits for the device: after the first the device has drained and the host issues the rest of the check
alone, so nothing of the check overlaps device work. Charged per attention forward:

- the host's issue: the record's host_rest_linears "realtime_tests" (the stack, once; a rank's empty_like, unbind
  and four asserts), measured by scripts/bench_host_testmode.py in torch Linear forwards, and the two all-gathers'
  issue (the record's "all-gather", bench_host_comm.py), at GPU.host_call_us;
- the two all-gathers on the device, which the asserts wait for: 4 x head_dim x 2 B a rank, latency-bound, NCCL's
  Ring latency (NVIDIA/nccl v2.27.7-1 tuning.cc: baseLat + (n-1-k) x max(intra, net overhead) + k x inter, k = nodes
  - 1 network steps; planner/cost/nccltuner.py's tables), under Simple where the launch forces Ring / Simple (the
  functional tests), else the least of LL, LL128 and Simple.

Not charged: the asserts' copy and synchronize in the driver (cudaMemcpyAsync, cudaStreamSynchronize) and the tiny
eq / all kernels' and the gather's copies' device time (no figure for them here), and where a block's forward is
device-bound, the host's lead lost at the first assert (the pass becomes max over the part before the check plus max
over the part after it, at least the max over the pass charged already): a lower bound.
"""

from __future__ import annotations

from planner.cost import hosttime, nccltuner, stepcomm
from planner.cost.comm import MS_PER_US, in_node_hardware
from planner.cost.layers import LayerCost
from planner.schema import Profile, TrainSetup

PART = "realtime_tests"  # the record's host_rest_linears entry: (the stack, a rank's share)
NORM_TENSORS = 4  # q_layernorm weight and bias, k_layernorm weight and bias
PARAM_BYTES = 2  # the norms' bf16 copies under --bf16 (Float16Module)


def all_gather_latency_us(ranks: int, nodes: int, setup: TrainSetup) -> float:
    """µs NCCL's Ring model gives a latency-bound all-gather of `ranks` ranks over `nodes` nodes (module docstring)."""
    if ranks <= 1:
        return 0.0
    intra_hw = in_node_hardware(setup)
    crossing = nccltuner.ring_inter_steps("all-gather", ranks, nodes)
    protocols = ("Simple",) if setup.training.nccl_ring_simple else nccltuner.PROTOCOLS

    def ring(protocol: str) -> float:
        p = nccltuner.PROTOCOLS.index(protocol)
        intra = nccltuner.HW_US[intra_hw]["Ring"][p]
        if crossing:
            factor = nccltuner.SIMPLE_OVERHEAD_FACTOR if protocol == "Simple" else 1
            intra = max(intra, nccltuner.NET_OVERHEAD_US * factor)
        inter = nccltuner.HW_US["network"]["Ring"][p]
        return nccltuner.BASE_US["Ring"][p] + (ranks - 1 - crossing) * intra + crossing * inter

    return min(ring(protocol) for protocol in protocols)


def _groups(setup: TrainSetup) -> list[tuple[int, int]]:
    """(ranks, nodes) of the DP group and the TP group the check gathers over."""
    tp, per_node = setup.comm.tp, setup.comm.domain
    dp = stepcomm.group_positions("dp_cp", setup)
    return [(len(dp), stepcomm.group_nodes("dp_cp", setup)), (tp, len({rank // per_node for rank in range(tp)}))]


def check_ms(profile: Profile, setup: TrainSetup) -> float:
    """ms one attention forward's check takes (the module's docstring); 0 without --test-mode, without q/k norms,
    for a latent attention (MLASelfAttention runs no check) or where the record or the GPU's host has no figure."""
    model = profile.assumptions.get("model") or {}
    if not setup.training.test_mode or not model.get("qk_norm") or model.get("kv_lora_rank"):
        return 0.0
    stack, per_rank = hosttime.rest_ms(profile, setup, PART)
    gather_issue, _ = hosttime.rest_ms(profile, setup, "all-gather")
    if not (stack or per_rank):
        return 0.0
    groups = _groups(setup)
    host = stack + sum(ranks for ranks, _ in groups) * per_rank + len(groups) * gather_issue
    device = sum(all_gather_latency_us(ranks, nodes, setup) for ranks, nodes in groups) * MS_PER_US
    return host + device


def realtime_tests_ms(layer: LayerCost, ckpt, profile: Profile, setup: TrainSetup) -> float:
    """ms per microbatch a dense block's --test-mode checks add: one a forward, one more in a full recompute's rerun."""
    if layer.kind != hosttime.DENSE_BLOCK:
        return 0.0
    return check_ms(profile, setup) * (2 if int(ckpt) == 1 else 1)
