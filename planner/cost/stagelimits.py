"""What a stage's own tensors may reach on its device: the cap less the communication libraries' buffers, the
allocator's fragmentation margin and the cuBLAS workspaces a rank keeps (the allocated limit every solver and
evaluate hold a stage to), and a rank's share of its node's host memory."""

from __future__ import annotations

from planner.cost import afterstep, allocator, asynctp, comm, nccl_buffers, runtimes, te_userbuffers
from planner.cost.terms import Context
from planner.schema import DataParallelSetup, PipelineSetup


def fragmentation(pipeline: PipelineSetup, *, device_type: str) -> float:
    """The share of reserved memory the caching allocator loses at the peak: cuda only, the
    setup's or the published mean (allocator.DEFAULT_FRAGMENTATION)."""
    if device_type != "cuda":
        return 0.0
    stated = pipeline.fragmentation
    return allocator.DEFAULT_FRAGMENTATION if stated is None else stated


def workspace_bytes(stage: int, ctx: Context) -> int:
    """The communication libraries' buffers on the rank holding `stage` (cuda; gloo on cpu: nothing): NCCL's per
    communicator (nccl_buffers.rank_buffers), AsyncTP's symmetric workspace, TE's userbuffers (te_userbuffers)."""
    if ctx.device_type != "cuda":
        return 0
    return sum(communicator_bytes(stage, ctx).values()) + async_tp_workspace_bytes(ctx) \
        + te_userbuffers.buffer_bytes(ctx.setup.comm, ctx.setup.training, ctx.profile.assumptions)


def communicator_bytes(stage: int, ctx: Context) -> dict[str, int]:
    """NCCL's buffers on the rank holding `stage`, by communicator (cuda; {} on cpu)."""
    if ctx.device_type != "cuda":
        return {}
    return nccl_buffers.rank_buffers(stage, ctx.setup, ctx.profile)


def async_tp_workspace_bytes(ctx: Context) -> int:
    """Where the setup runs its runtime's AsyncTP and the record says the fused ops take a
    symmetric-memory workspace (RuntimeFacts.async_tp_workspace): its bytes, the largest request of
    any layer's fused collectives (asynctp.symmetric_workspace_bytes). 0 elsewhere."""
    setup = ctx.setup
    if setup.comm.tp <= 1 or comm.tp_overlap_source(setup.comm, setup.training) is None:
        return 0
    if setup.comm.tp_overlap != "async-tp" or not runtimes.of(setup.training).async_tp_workspace:
        return 0
    return max((asynctp.symmetric_workspace_bytes(layer.collectives, setup.comm.tp, float8=setup.training.float8)
                for layer in ctx.profile.layers), default=0)


def limit_bytes(stage: int, ctx: Context) -> int:
    """The allocated peak stage `stage`'s own tensors may reach: its cap on cpu; on cuda what stays
    once the communication buffers are taken, less the allocator's fragmentation margin and segment
    rounding (allocator.allocated_limit: its reserved peak then stays within the cap), less the cuBLAS
    workspaces the rank keeps from its first matmul (cublas_workspaces_bytes: the allocated peak
    rank_cost reports holds them, and its limit with them)."""
    cap = ctx.setup.pipeline.mem_caps_bytes[stage]
    if ctx.device_type != "cuda":
        return cap
    return int(allocator.allocated_limit(cap - workspace_bytes(stage, ctx),
                                         fragmentation(ctx.setup.pipeline, device_type=ctx.device_type))) \
        - cublas_workspaces_bytes(ctx, stage)


def cublas_workspaces_bytes(ctx: Context, rank: int | None = None) -> int:
    """The cuBLAS workspaces a rank's runtime keeps from its first matmul to the end (afterstep.workspace_bytes: torch's,
    CublasHandlePool.cpp getNewWorkspace; TE's, a torch.empty) and Megatron-core's global buffer (global_buffer_bytes;
    the output layer's where `rank` holds the last stage, None: every rank's): allocated bytes, in Megatron's log."""
    return afterstep.first_forward_bytes(ctx.setup.training, ctx.profile, ctx.setup.comm,
                                         holds_output=afterstep.holds_last_stage(rank, ctx.setup.pipeline))


def host_cap_bytes(data_parallel: DataParallelSetup, *, pipeline: PipelineSetup) -> int | None:
    """A rank's share of its node's host memory: the node's ranks may hold any stage, so each
    gets host_mem / the ranks on a node (dataparallel.host_bytes_per_node). None: not capped."""
    if data_parallel.host_mem_bytes is None:
        return None
    return data_parallel.host_mem_bytes // min(data_parallel.devices_per_node, pipeline.stages * data_parallel.dp)
