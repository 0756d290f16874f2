"""Mixture-of-experts layers under FakeTensorMode (`ckplan profile --fake`): their routed experts,
their routing's expectation, and their grouped matmuls' work.

A fake tensor has shapes, not values, so no router's choice can be read: which expert each token
copy reaches is unknown. What is known is structural. The experts modules are found as the
measured profiler finds them (planner/runtime/routing.py's contract: a submodule named `experts`
with `num_experts` and every parameter stacked over the experts), so their parameters are exact;
and the router's output has its shape, (tokens, top-k), so the token copies the experts compute,
tokens x top-k, are exact too where the experts' code is dropless (transformers 5's experts are:
grouped_mm_experts_forward, integrations/moe.py at 5.24, sorts every copy by expert and runs one
grouped matmul over all of them, whatever the routing). The one thing values would decide, how the
copies spread over the experts, is charged as its expectation: balanced, every expert
tokens x top-k / experts copies (the analytic profile's capacity factor 1). A planner must use that
expectation when values are fake; the profile says so in its assumptions ("routing").

torch's FLOP counter (2.13) has no formula for aten._grouped_mm, the kernel those experts run,
so their matmuls would count as no work: grouped_mm_flops is its formula (2 x rows x the
contracted size x columns, for each of its operand layouts), and grouped_kernels times it as one
matmul per expert over its balanced share, as the analytic profile times each expert
(planner/profiler/analytic_time.py).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from planner.profiler.roofline import Kernel
from planner.profiler.storages import StorageTracker, storage_key, storage_nbytes
from planner.runtime.routing import Routing, layer_routing

ROUTING_NOTE = ("a fake tensor has no values, so no router's choice is read: each MoE layer's token copies "
                "(tokens x top-k, from the router's output shape) are charged balanced over its routed experts "
                "(routed_tokens: tokens x top-k / experts each, capacity factor 1), the expectation a planner uses; "
                "kept bytes, FLOPs and a2a_bytes are the experts' own dropless code run on those copies")


def grouped_mm_flops(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """FLOPs of aten._grouped_mm(a, b, offs): 2 x rows x contracted x columns summed over the
    groups, in each layout torch accepts (aten/src/ATen/native/GroupedMMUtils.h, torch 2.13):
    2d x 3d (tokens sorted by expert x each expert's weight: the forward and the input gradient),
    2d x 2d (the weight gradient, the groups along the contracted tokens), 3d x 2d, 3d x 3d (batched)."""
    if len(a_shape) == 2 and len(b_shape) == 3:
        return 2 * a_shape[0] * a_shape[1] * b_shape[2]
    if len(a_shape) == 2 and len(b_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    if len(a_shape) == 3 and len(b_shape) == 2:
        return 2 * a_shape[1] * a_shape[2] * b_shape[1]
    return 2 * a_shape[0] * a_shape[1] * a_shape[2] * b_shape[2]


def grouped_kernels(kernel: Kernel, args: tuple, kwargs: dict) -> list[Kernel]:
    """A grouped matmul (`kernel`, all its FLOPs) as one matmul per group (expert), each an equal
    share: the balanced routing the fake profile charges (the groups' sizes are the offsets' values)."""
    offs = kwargs.get("offs", args[2] if len(args) > 2 else None)
    groups = offs.shape[0] if offs is not None else args[0].shape[0]
    return [replace(kernel, flops=kernel.flops // groups)] * groups


def fake_routing(layer: nn.Module, x: torch.Tensor) -> Routing | None:
    """The measured profile's routing record (routing.layer_routing) from one fake forward: the
    experts' parameters, the token copies charged balanced (module order), the dispatch's bytes,
    and what the experts modules save for backward; None for a layer without experts."""
    return layer_routing(layer, x, count=lambda top_k_index, experts: balanced(top_k_index.numel(), experts),
                         key=storage_key, nbytes=storage_nbytes)


def balanced(copies: int, num_experts: int) -> list[int]:
    """`copies` token copies spread as evenly as whole tokens allow over `num_experts` experts."""
    share, left = divmod(copies, num_experts)
    return [share + (index < left) for index in range(num_experts)]


def expert_transient_bytes(layer: nn.Module, x: torch.Tensor, grad: torch.Tensor | None, transient: int) -> int:
    """Of the layer's transient, what its routed experts' weight gradients make (measure.py's
    _expert_transient_bytes, its storages followed as the fake profiler follows them)."""
    from planner.profiler.measure import _expert_transient_bytes

    return _expert_transient_bytes(layer, x, grad, transient, tracker=lambda device: StorageTracker())
