"""Mixture-of-experts layers: where their routed experts are, and how the tokens of a
microbatch were routed to them.

The experts contract (transformers 5's MoE models, MixtralExperts and Qwen2MoeExperts,
and configs/models/moe.py follow it): a submodule named `experts` with

    num_experts                           an int, E
    every parameter                       stacked over the experts: shape (E, ...)
    forward(hidden, top_k_index, top_k_weights) -> out
        hidden (T, H), top_k_index (T, k) integers in [0, E), top_k_weights (T, k):
        out[t] = sum over j of top_k_weights[t, j] * expert_{top_k_index[t, j]}(hidden[t])

Dropless: every token copy reaches its expert, so routing changes which expert computes
what, never how many token copies are computed (T x k per microbatch). The profile
records the tokens each expert received on the profiled microbatch (routed_tokens), the
routed experts' parameters (expert_param_count, which expert parallelism splits) and the
bytes their dispatch sends (a2a_bytes); runtime/experts.py splits them over ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


def is_experts(name: str, module: nn.Module) -> bool:
    """`module`, named `name` in its parent, follows the experts contract."""
    num_experts = getattr(module, "num_experts", None)
    params = list(module.parameters())
    return (name.rsplit(".", 1)[-1] == "experts" and isinstance(num_experts, int) and num_experts > 0
            and bool(params) and all(param.dim() >= 1 and param.shape[0] == num_experts for param in params))


def find_experts(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The experts modules inside `module` (FQNs relative to it), in module order."""
    return [(name, child) for name, child in module.named_modules() if name and is_experts(name, child)]


@dataclass(frozen=True)
class Routing:
    """One layer's routed experts on one microbatch."""

    expert_param_count: int  # the routed experts' parameters
    routed_tokens: list[int]  # tokens each expert received, experts of several modules in module order
    a2a_bytes: int  # every routed token copy's hidden state: what the dispatch sends (the combine as much back)
    expert_act_bytes: int  # what the experts modules' forwards save for backward: it grows with the copies a rank computes


def routed_counts(top_k_index: torch.Tensor, num_experts: int) -> list[int]:
    """The token copies the router sent each expert, read from its choices' values."""
    return torch.bincount(top_k_index.reshape(-1), minlength=num_experts).tolist()


def _storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _storage_bytes(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().nbytes()


def layer_routing(layer: nn.Module, x: torch.Tensor, *, count: Callable[[torch.Tensor, int], list[int]] = routed_counts,
                  key: Callable[[torch.Tensor], int] = _storage_key,
                  nbytes: Callable[[torch.Tensor], int] = _storage_bytes) -> Routing | None:
    """Run `layer` on `x` once and count the tokens its routers sent each expert (`count`: from the
    choices' values; the fake profiler passes its expectation, having none), and the bytes its experts
    modules saved for backward (storages told apart by `key`, sized by `nbytes`: a fake tensor's
    storage has no address); None for a layer without experts."""
    found = find_experts(layer)
    if not found:
        return None
    counts: list[list[int]] = []
    sent = [0]
    params = {key(param) for param in layer.parameters()}
    saved: dict[int, int] = {}  # storage -> bytes, saved inside an experts module's forward

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if key(tensor) not in params:
            saved[key(tensor)] = nbytes(tensor)
        return tensor

    contexts = []

    def enter(module: nn.Module, args: tuple, kwargs: dict) -> None:
        hidden, top_k_index = (*args, *kwargs.values())[:2]  # positional or by keyword, in the contract's order
        counts.append(count(top_k_index, module.num_experts))
        sent[0] += top_k_index.numel() * hidden.shape[-1] * hidden.element_size()
        contexts.append(torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor))
        contexts[-1].__enter__()

    def leave(module: nn.Module, args: tuple, kwargs: dict, output) -> None:
        contexts.pop().__exit__(None, None, None)

    hooks = [hook for _, module in found for hook in (module.register_forward_pre_hook(enter, with_kwargs=True),
                                                      module.register_forward_hook(leave, with_kwargs=True))]
    try:
        with torch.enable_grad():
            output = layer(x.detach().requires_grad_(x.is_floating_point()))
        del output  # held until here: every saved storage was alive when counted
    finally:
        for hook in hooks:
            hook.remove()
    expert_params = sum(param.numel() for _, module in found for param in module.parameters())
    return Routing(expert_params, [n for module_counts in counts for n in module_counts], sent[0], sum(saved.values()))


def rank_load(routed_tokens: list[int], num_experts: int, ep: int) -> float:
    """The most token copies one of `ep` ranks computes, over the mean (1: balanced), were
    every rank's microbatch routed as `routed_tokens` (per expert, modules of `num_experts`
    in turn): rank i holds experts [i x E / ep, (i + 1) x E / ep) of each module."""
    total = sum(routed_tokens)
    if ep == 1 or not total:
        return 1.0
    per_rank = [0] * ep
    for index, count in enumerate(routed_tokens):
        per_rank[index % num_experts // (num_experts // ep)] += count
    return max(per_rank) * ep / total
