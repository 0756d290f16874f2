"""Data parallelism around the pipeline: a device mesh (pipeline x replicate x shard) and
each stage's data-parallel ranks running the plan's ZeRO stage with what torch has.

Ranks: `stages x dp`, stage-major: rank = stage * dp + dp_index, and a stage's data-parallel
index splits as dp_index = replica * K + shard_index (K: the shard group). dp 4, K 2: stage 0's
shard groups are ranks [0,1] and [2,3], its replica groups [0,2] and [1,3]; a pipeline
(the ranks that pass activations to each other) is one dp_index across the stages.

The ZeRO stages, mapped onto torch (nothing here shards by itself):
    ZeRO 0  replicated weights; after the schedule's last backward every gradient is
            all-reduced over the stage's dp ranks and averaged (what DDP does, without its
            overlap: DDP trips its reducer's assert under the pipeline's shape inference, and
            FSDP2's replicate() holds a second copy of the weights and gradients during the step)
    ZeRO 1  the same, and ZeroRedundancyOptimizer over the shard group: each rank keeps the
            optimizer state of its 1/K of the parameters (whole tensors, balanced by size),
            steps them and broadcasts them in the group. FSDP2 cannot do ZeRO 1: it always
            keeps weights and gradients sharded.
    ZeRO 2  FSDP2 fully_shard(reshard_after_forward=False) per layer (frozen ones too) and on the stage, on the
            (replicate, shard) mesh (HSDP; plain FSDP when one group): weights, gradients and
            optimizer state sharded; a layer's weights gathered for its forward and kept to its
            backward. FSDP2 keeps its 1/K shard of the weights beside what it gathers, so a
            layer gathered holds 1 + 1/K of its weights (DeepSpeed's ZeRO 2 holds them whole, 1)
    ZeRO 3  fully_shard(reshard_after_forward=True): the weights resharded after each forward
            and gathered again for the backward
The plan's zero_gather says when ZeRO 2/3 reduce: "per-microbatch" (ZeRO's own way: every
backward runs with FSDP2's hooks on, so each layer's gradient is reduce-scattered and its
weights resharded as its backward ends, one layer's unsharded at a time; the worker's
TimedStage turns them on) or "per-iteration" (torch's pipeline
schedule as it is: gradients whole and weights gathered from a stage's first backward to
its last, reduced once). Gradients are averaged over dp and the schedule divides by the
microbatches, so a step sees the mean over dp x M microbatches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer

from planner.cost.dataparallel import shard_size
from planner.cost.optimizers import make_optimizer, optimizer_class
from planner.runtime.experts import expert_params, reduce_expert_grads
from planner.runtime.offload import OffloadOptimizer, local
from planner.runtime.stagemodule import StageModule
from planner.schema import TrainSetup

MESH_DIMS = ("pp", "replicate", "shard")


@dataclass(frozen=True)
class Layout:
    """Where every rank sits: `stages` pipeline stages, each on `dp` ranks, ZeRO sharding
    inside groups of `shard` of them (1: nothing sharded)."""

    stages: int
    dp: int
    shard: int

    @classmethod
    def of(cls, setup: TrainSetup) -> Layout:
        return cls(setup.pipeline.stages, setup.data_parallel.dp, shard_size(setup))

    @property
    def replicas(self) -> int:
        return self.dp // self.shard

    @property
    def world_size(self) -> int:
        return self.stages * self.dp

    def rank(self, stage: int, dp_index: int) -> int:
        return stage * self.dp + dp_index

    def stage_of(self, rank: int) -> int:
        return rank // self.dp

    def dp_index_of(self, rank: int) -> int:
        return rank % self.dp

    def shard_groups(self, stage: int) -> list[list[int]]:
        return [[self.rank(stage, r * self.shard + k) for k in range(self.shard)] for r in range(self.replicas)]

    def replica_groups(self, stage: int) -> list[list[int]]:
        return [[self.rank(stage, r * self.shard + k) for r in range(self.replicas)] for k in range(self.shard)]

    def pipelines(self) -> list[list[int]]:
        """The ranks of each pipeline replica, in stage order, by dp_index."""
        return [[self.rank(stage, d) for stage in range(self.stages)] for d in range(self.dp)]


def device_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    """The world as (pp, replicate, shard); every rank must call it (it creates groups)."""
    return init_device_mesh(device_type, (layout.stages, layout.replicas, layout.shard), mesh_dim_names=MESH_DIMS)


def data_parallel(module: StageModule, *, zero: int, mesh: DeviceMesh) -> tuple[nn.Module, Callable[[], None]]:
    """The stage module wrapped for its ZeRO stage (see the module docstring), and what
    reduces its gradients after the schedule's step (FSDP2 reduces within the schedule)."""
    if zero <= 1:
        return module, partial(average_grads, module, mesh["replicate", "shard"]._flatten("dp").get_group())
    dp_mesh = mesh["shard"] if mesh["replicate"].size() == 1 else mesh["replicate", "shard"]  # FSDP or HSDP
    # one FSDP2 unit per pipeline layer: gathered while it computes (torchtitan's way); layers that share a
    # parameter (tied weights on one stage) one unit together, as FSDP2 requires of a shared parameter and
    # torchtitan b5bcd76c does (distributed/fsdp.py 238-249; docs/framework-facts.md §308). A frozen layer is a
    # unit too, and a wholly frozen stage is sharded: FSDP2 gathers a frozen parameter and never reduces it, as
    # torchtitan shards every block whatever requires grad (framework-facts §733-§734); the cost model charges
    # each layer its own unit (fsdpunits.py "per-layer")
    for unit in _units(module.layers):
        if any(list(layer.parameters()) for layer in unit):  # a layer without parameters has nothing to shard
            fully_shard(unit if len(unit) > 1 else unit[0], mesh=dp_mesh, reshard_after_forward=zero == 3)
    return fully_shard(module, mesh=dp_mesh, reshard_after_forward=zero == 3), _nothing


def _units(layers: list[nn.Module]) -> list[list[nn.Module]]:
    """The layers in order, those sharing a parameter with an earlier one joined to its unit."""
    units: list[list[nn.Module]] = []
    owner: dict[int, list[nn.Module]] = {}
    for layer in layers:
        unit = next((owner[id(p)] for p in layer.parameters() if id(p) in owner), None)
        if unit is None:
            unit = []
            units.append(unit)
        unit.append(layer)
        owner.update({id(p): unit for p in layer.parameters()})
    return units


def _nothing() -> None:
    pass


def average_grads(module: nn.Module, group) -> None:
    """Every gradient summed over `group` and divided by its size (gloo has no average); the
    experts split by expert parallelism over their own group (experts.reduce_expert_grads)."""
    split = {id(param) for param, _ in expert_params(module)}
    grads = [param.grad for param in module.parameters() if param.grad is not None and id(param) not in split]
    for work in [dist.all_reduce(grad, group=group, async_op=True) for grad in grads]:
        work.wait()
    for grad in grads:
        grad.div_(dist.get_world_size(group))
    if split:
        reduce_expert_grads(module)


def dp_optimizer(name: str, module: nn.Module, *, zero: int, offload: bool, mesh: DeviceMesh | None,
                 overlap: bool = True) -> torch.optim.Optimizer | None:
    """The stage's optimizer: whole (ZeRO 0, or the local shards FSDP2 keeps for ZeRO 2/3),
    partitioned over the shard group (ZeRO 1), and stepping on the host with `offload`
    (its copies and step overlapped in chunks, or with `overlap=False` one after another)."""
    params = [param for param in module.parameters() if param.requires_grad]
    if not params:
        return None
    if zero == 1 and mesh is not None and mesh["shard"].size() > 1:
        return zero_one(params, name, offload=offload, overlap=overlap, group=mesh["shard"].get_group())
    return OffloadOptimizer(params, optimizer=name, overlap=overlap) if offload else make_optimizer(name, params)


def zero_one(params: list[torch.Tensor], name: str, *, offload: bool, overlap: bool,
             group) -> ZeroRedundancyOptimizer:
    """ZeroRedundancyOptimizer over the shard group (the gradients are averaged before)."""
    if offload:
        return ZeroRedundancyOptimizer(params, optimizer_class=OffloadOptimizer, process_group=group,
                                       optimizer=name, overlap=overlap)
    cls, kwargs = optimizer_class(name)
    return ZeroRedundancyOptimizer(params, optimizer_class=cls, process_group=group, **kwargs)


def state_tensors(module: nn.Module) -> list[torch.Tensor]:
    """The weights and gradients a stage module holds right now: its parameters and their
    gradients; under FSDP2 (fully_shard) each parameter's shard and gradient shard,
    and its gathered weight and accumulated whole gradient where they are allocated (a freed
    one has a storage of 0 bytes)."""
    if not isinstance(module, FSDPModule):
        return [t for param in module.parameters() for t in (param, param.grad) if t is not None]
    state = fully_shard.state(module)
    tensors = []
    for inner in state._state_ctx.all_states:
        for group in inner._fsdp_param_groups:
            for fsdp_param in group.fsdp_params:
                sharded = fsdp_param.sharded_param
                whole = getattr(fsdp_param, "_unsharded_param", None)
                tensors += [sharded, sharded.grad, whole, whole.grad if whole is not None else None,
                            fsdp_param.unsharded_accumulated_grad]
    return [local(t) for t in tensors if t is not None]
