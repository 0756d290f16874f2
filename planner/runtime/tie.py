"""Keep parameters shared by layers on different stages tied, as Megatron keeps its input
and output embeddings tied: one process group per shared parameter over the stages
that hold it; the same initial value on all of them (broadcast from the first); their
gradients summed over the group before every optimizer step, so every copy takes the
same step and stays equal to the one parameter of a one-process run. With data
parallelism, one group per pipeline replica (the stages' ranks of one dp index), after the
data-parallel reduction; with FSDP2 each copy is sharded the same way on every stage, so
the groups sum matching shards.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from planner.cost.tied import TiedParam, cross_stage, lookup
from planner.runtime.offload import local


@dataclass
class Tie:
    param: nn.Parameter  # this stage's copy
    group: dist.ProcessGroup  # the stages holding a copy
    stages: list[int]
    layer: str  # where the copy sits in the stage module (to find it again once wrapped)
    name: str


def tie_groups(module: nn.Module, tied: list[TiedParam], stage_layers: list[list[str]], stage: int, *,
               pipelines: list[list[int]] | None = None, dp_index: int = 0) -> list[Tie]:
    """Create a group per parameter shared across stages and pipeline replica (every rank
    must call this: new_group is collective over the world) and align this rank's copies
    with the first holder's. pipelines[d]: the global ranks of replica d's stages (default:
    one replica, rank = stage)."""
    pipelines = pipelines or [list(range(len(stage_layers)))]
    ties = []
    mine = set(stage_layers[stage])
    for item, stages in cross_stage(tied, stage_layers):
        groups = [dist.new_group([ranks[s] for s in stages]) for ranks in pipelines]
        if stage not in stages:
            continue
        layer, name = next((layer, name) for layer, name in item.names if layer in mine)
        param = lookup(module, layer, name)
        with torch.no_grad():
            dist.broadcast(param, src=pipelines[dp_index][stages[0]], group=groups[dp_index])
        ties.append(Tie(param, groups[dp_index], stages, layer, name))
    return ties


def relink(ties: list[Tie], module: nn.Module) -> list[Tie]:
    """The same ties on the parameters a wrapper (FSDP2) put in place of the originals."""
    return [Tie(lookup(module, tie.layer, tie.name), tie.group, tie.stages, tie.layer, tie.name) for tie in ties]


def sum_tied_grads(ties: list[Tie]) -> None:
    """Each stage's copy got the gradient of its own uses; the parameter's is their sum."""
    for tie in ties:
        if tie.param.grad is not None:
            dist.all_reduce(local(tie.param.grad), op=dist.ReduceOp.SUM, group=tie.group)
