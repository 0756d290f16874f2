"""Expert parallelism over the data-parallel ranks (`solve --ep E`, E dividing dp).

The dp ranks of a stage split into groups of E consecutive ones (dp_index // E): an
expert-parallel group. Each of its ranks holds E_total / E of the routed experts of every
MoE layer (rank i of the group: experts [i x n, (i + 1) x n), n = E_total / E), the
rest of the layer (attention, norms, router, shared expert) whole. The ranks holding the
same experts (same dp_index % E, dp / E of them) are that expert's data-parallel group.

A MoE layer's experts module (the contract in planner/runtime/routing.py, transformers
5's and configs/models/moe.py's) runs on each rank as:

    dispatch  every token copy (token, j) goes, sorted by its expert, to the rank owning
              that expert: all_to_all_single over the expert-parallel group, the counts first
    experts   the module's own forward on the copies received, each with its local expert
              and its router weight (sent along): w x expert(row), what one process computes
              and keeps for backward for that copy
    combine   the weighted outputs back to their tokens' ranks (all_to_all_single again),
              summed over j in order, as one process sums them

Both all-to-alls have their gradient (the reverse all-to-all). Dropless: the split sizes
are the routing's, nothing is padded or dropped, so a step computes what one process
does. Gradients: the dense parameters are averaged over all dp ranks (mesh.average_grads);
an expert's gradient already holds the contributions of its whole expert-parallel group's
tokens, so it is summed over the expert's data-parallel group and divided by dp.

Recompute (a checkpointed MoE layer) runs the all-to-alls again; the ranks of a group run
the same schedule, so they meet there. ZeRO 1-3 with E > 1 are not run here: ZeRO's
partitions would mix different experts across the group.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from planner.errors import UserError
from planner.runtime.heartbeat import collective
from planner.runtime.routing import find_experts
from planner.schema import TrainSetup


@dataclass(frozen=True)
class ExpertShard:
    """Where one rank's share of an experts module sits."""

    group: dist.ProcessGroup  # the expert-parallel group (the all-to-alls)
    data_group: dist.ProcessGroup  # the ranks holding the same experts (their gradient sum)
    ep: int
    ep_rank: int
    dp: int  # all data-parallel ranks: an expert's gradient is divided by it
    num_experts: int  # of the whole layer

    @property
    def local(self) -> int:
        return self.num_experts // self.ep


def expert_parallel(module: nn.Module, setup: TrainSetup, *, device_type: str) -> None:
    """Split the routed experts of `module` (a stage) over the expert-parallel group.
    Every rank calls it (it creates the process groups), whatever its stage holds."""
    ep, dp = setup.data_parallel.ep, setup.data_parallel.dp
    if ep == 1:
        return
    if setup.data_parallel.zero:
        raise UserError(f"expert parallelism (ep {ep}) runs on ckplan's runtime with ZeRO 0 only; solve "
                        "with --zero 0, or export the plan to Megatron-LM or torchtitan")
    mesh = init_device_mesh(device_type, (setup.pipeline.stages, dp // ep, ep), mesh_dim_names=("pp", "edp", "ep"))
    for name, experts in find_experts(module):
        if experts.num_experts % ep:
            raise UserError(f"{name} has {experts.num_experts} experts, which ep {ep} does not divide; solve "
                            f"with an --ep dividing {experts.num_experts}")
        shard = ExpertShard(mesh["ep"].get_group(), mesh["edp"].get_group(), ep, mesh["ep"].get_local_rank(), dp,
                            experts.num_experts)
        _keep_own(experts, shard)
        experts.forward = partial(dispatch, shard, type(experts).forward.__get__(experts))
        experts.expert_shard = shard


def _keep_own(experts: nn.Module, shard: ExpertShard) -> None:
    """Keep this rank's experts only (a copy: the whole tensors are freed)."""
    start = shard.ep_rank * shard.local
    for name, param in list(experts.named_parameters()):
        *path, leaf = name.split(".")
        owner = experts.get_submodule(".".join(path))
        setattr(owner, leaf, nn.Parameter(param.detach()[start:start + shard.local].clone(),
                                          requires_grad=param.requires_grad))
    experts.num_experts = shard.local


def expert_params(module: nn.Module) -> list[tuple[nn.Parameter, ExpertShard]]:
    """The parameters `expert_parallel` split, each with its shard."""
    return [(param, experts.expert_shard) for _, experts in find_experts(module)
            if hasattr(experts, "expert_shard") for param in experts.parameters()]


def reduce_expert_grads(module: nn.Module) -> None:
    """Each expert's gradient summed over its data-parallel group and divided by dp."""
    held = [(param.grad, shard) for param, shard in expert_params(module) if param.grad is not None]
    works = [dist.all_reduce(grad, group=shard.data_group, async_op=True) for grad, shard in held
             if dist.get_world_size(shard.data_group) > 1]
    for work in works:
        work.wait()
    for grad, shard in held:
        grad.div_(shard.dp)


# what a rank inside the experts' exchange does: it waits for its expert-parallel partners
# (the heartbeat then names a partner still in its own compute, not this rank)
ALL_TO_ALL = "the experts' all-to-all (a wait for the expert-parallel group)"


def dispatch(shard: ExpertShard, local_forward, hidden: torch.Tensor, top_k_index: torch.Tensor,
             top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts module's forward under expert parallelism (see the module docstring)."""
    num_tokens, top_k = top_k_index.shape
    expert_ids, order = top_k_index.reshape(-1).sort(stable=True)  # token copies grouped by expert
    sent_per_expert = torch.bincount(expert_ids, minlength=shard.num_experts)
    received_per_expert = torch.empty_like(sent_per_expert)  # [source rank, local expert], flattened
    with collective(ALL_TO_ALL):
        dist.all_to_all_single(received_per_expert, sent_per_expert, group=shard.group)
    sent = sent_per_expert.view(shard.ep, shard.local).sum(dim=1).tolist()
    received = received_per_expert.view(shard.ep, shard.local).sum(dim=1).tolist()
    rows = _AllToAll.apply(hidden[order // top_k], sent, received, shard.group)
    weights = _AllToAll.apply(top_k_weights.reshape(-1, 1)[order], sent, received, shard.group)
    local_ids = torch.repeat_interleave(torch.arange(shard.local, device=hidden.device).repeat(shard.ep),
                                        received_per_expert)
    weighted = local_forward(rows, local_ids.unsqueeze(1), weights)  # one copy per row: w x expert(row)
    copies = _AllToAll.apply(weighted, received, sent, shard.group)[torch.argsort(order)]  # (token, j) order
    return copies.view(num_tokens, top_k, -1).sum(dim=1)


class _AllToAll(torch.autograd.Function):
    """all_to_all_single of rows (send[i] rows to rank i, recv[i] from it); its gradient
    goes back the same way reversed."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, send: list[int], recv: list[int], group) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _exchange(rows, send, recv, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _exchange(grad, ctx.recv, ctx.send, ctx.group), None, None, None


def _exchange(rows: torch.Tensor, send: list[int], recv: list[int], group) -> torch.Tensor:
    out = rows.new_empty((sum(recv), *rows.shape[1:]))
    with collective(ALL_TO_ALL):
        dist.all_to_all_single(out, rows.contiguous(), recv, send, group=group)
    return out
