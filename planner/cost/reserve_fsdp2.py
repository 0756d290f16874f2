"""A rank's reserved peak under FSDP2 (torchtitan's step: one stage, one microbatch or several accumulated
(fsdp2_accum.py), or beside a 1F1B, GPipe or interleaved 1F1B pipeline: fsdp2_chunks.py drives each of a
rank's chunks, fsdp2_events.py builds the events), from the caching allocator's replay (allocator.replay) of the
allocations FSDP2 and the layers make, each on the stream FSDP2 makes it on. The bytes are the cost
model's own (the layers' kept and extra terms, the units of fsdpunits.py, the static shards of
dataparallel.py); this module adds their order and their streams. Read at torch 2.6.0 (git 2236df17;
torchtitan 9dec370 ran torch 1963fc8, of the same December 2024 main), torch/distributed/fsdp/
_fully_shard/ (docs/framework-facts.md §24):

- all-gather (foreach_all_gather, _fsdp_collectives.py 127-179): on the all-gather copy-in stream
  (FSDPCommContext, _fsdp_param_group.py 49-90) the shard is cast into a flat staging buffer
  (_get_param_all_gather_inputs 220-229: G / K bytes, freed as the function returns, line 162) and
  copied into the unit's flat all-gather output (all_gather_copy_in_cuda 68-89: G bytes), both blocks
  of the copy-in stream's pool. The output is read on the all-gather stream and the default stream
  and is kept alive by reference, never record_stream: in forward until the next unit's copy-out
  (AllGatherState, wait_for_unshard 271-307: "free the all-gather result", 286), in backward until
  its own copy-out (306).
- copy-out (foreach_all_gather_copy_out 234-316, in wait_for_unshard, on the default stream): each
  parameter's unsharded storage is allocated again (_fsdp_param.py alloc_all_gather_outputs 650-652,
  resize_ of a storage: the current stream's pool) and freed by reshard (free_unsharded_param
  654-674, resize_(0)): after the unit's forward where it reshards after forward (post_forward
  339-345), and in its post-backward (reshard before the reduce, 404).
- backward prefetch (_backward_prefetch 469-483): a unit's pre-backward all-gathers the unit whose
  post-forward ran just before its own (comm_ctx.post_forward_order), on the copy-in stream.
- gradients: autograd makes each unsharded parameter's gradient in the weights' dtype on the default
  stream; the unit's post-backward (post_backward 374-442) reshards, drops the previous unit's
  reduce-scatter input (reduce_scatter_state, after waiting on its event, 407-412), allocates the new
  one in the reduce dtype on the default stream (foreach_reduce 371-375, outside the reduce-scatter
  stream's context), frees the gradients once copied in (378), and allocates the reduce-scatter
  output, the sharded gradient (fp32, G / K), on the reduce-scatter stream (382-383): its block is
  that stream's, so the default stream never reuses it. The sharded gradient lives until the next
  step's zero_grad (set_to_none; torchtitan 9dec370 train.py 266); the last reduce-scatter input
  until the root's final callback (_fsdp_state.py 284-308) at the backward's end.
- the shards: allocated before the first step, on the default stream; the optimizer's state at the first
  step's optimizer step (torch 2.6.0 AdamW._init_group, adamw.py 132-183: exp_avg then exp_avg_sq per
  parameter; torchtitan 9dec370 loads no checkpoint before, so none exists earlier), into what the first
  step's activations left cached; foreach AdamW's sqrt(v) scratch (the cost model's step_scratch_bytes) made
  and freed in every step. torchtitan's logged peak is reset to what is reserved, and no segment is
  released in the loop, so the first step's segments count (docs/framework-facts.md §31).
- the loss's scratch: tensors of the fp32 logits' size (9dec370 train.py 131-134: the fp32 copy, log_softmax's
  output and the two gradients are each the logits' shape), where the loss is the runtime's formula.

An analytic LLaMA block's parameters are its nine tensors (parameter_parts); other analytic layers one.
The allocator runs expandable segments where the job's launch sets them (expandable_segments: stated by
--expandable-segments, else as the runtime's launch script does: torchtitan's on one node, not across nodes).
Not replayed: gradient clipping's per-tensor norms (512 B blocks in the small pool), the NCCL buffers
(outside the allocator, workspace_bytes), the activations tensor by tensor (a layer's kept bytes are
one block; its forward's other requests and its backward's extra are its record's tensors where it has one,
fsdp2_layers.forward_program and backward_program, an analytic checkpointed forward's alive to its end); beside 1F1B or GPipe, each microbatch's input gradient left
on its receive buffer's `.grad` to the next step (torch 2.6.0 pipelining/_backward.py 350-360,
stage.py 507-520): the cost model counts one, among the buffers, and so does the replay.

Nothing here reads a file or prints.
"""

from __future__ import annotations

from planner.cost import allocator, dataparallel, fsdp2_accum, fsdpunits, runtimes
from planner.cost.allocator import Replayed
from planner.cost.fsdp2_accum import Fsdp2Accumulated
from planner.cost.fsdp2_events import (
    MAX_STEPS,
    STEPS,
    Fsdp2Stage,
    one_step,
    step_events,
)
from planner.cost.fsdp2_layers import (
    chunk_layers,
    loss_forward_program,
    loss_program,
    loss_tensor_bytes,
    program_kept_bytes,
)
from planner.errors import UserError
from planner.schema import Profile, StagePlan, TrainSetup


def replay(stage, *, expandable: bool = False, cap_bytes: int | None = None,
           perturb: allocator.Perturb | None = None) -> Replayed:
    """The allocator's peaks over the step of `stage`: an Fsdp2Stage, one stage's step over several
    microbatches without a pipeline (fsdp2_accum.Fsdp2Accumulated), or a rank of several chunks
    (fsdp2_chunks.Fsdp2Rank); under `cap_bytes` (allocator.settled_replay; None: no cap); its sequence changed by
    `perturb` (None: as the step makes it; planner/cost/reserve_range.py)."""
    if isinstance(stage, Fsdp2Accumulated):
        return fsdp2_accum.replay(stage, expandable=expandable, cap_bytes=cap_bytes, perturb=perturb)
    if not isinstance(stage, Fsdp2Stage):
        from planner.cost import fsdp2_chunks

        return fsdp2_chunks.replay(stage, expandable=expandable, cap_bytes=cap_bytes, perturb=perturb)
    return allocator.settled_replay(step_events(stage, steps=0), lambda index: one_step(stage, index),
                                    min_steps=STEPS, max_steps=MAX_STEPS, expandable=expandable,
                                    cap_bytes=cap_bytes, perturb=perturb)


def launch_sets_expandable(setup: TrainSetup, *, job_gpus: int, gpus_per_node: int) -> bool:
    """Whether the launch sets expandable segments: as stated, else as the runtime's own launch does on this
    many nodes (RuntimeFacts); the replay reads it and ckplan's launch files set it (emit/launchers.py)."""
    stated, record = getattr(setup.training, "expandable_segments", None), runtimes.of(setup.training)
    if stated is not None:
        return stated
    return record.expandable_segments and (record.expandable_segments_across_nodes or job_gpus <= gpus_per_node)


def expandable_segments(profile: Profile, setup: TrainSetup) -> bool:
    """Whether the replay runs expandable segments: the job's launch sets them (--expandable-segments,
    else as the runtime's launch script does: RuntimeFacts.expandable_segments) on a GPU whose torch
    honoured them (not ROCm: GPU.rocm)."""
    if not launch_sets_expandable(setup, job_gpus=job_gpus(profile, setup), gpus_per_node=setup.comm.gpus_per_node):
        return False
    try:
        return not dataparallel.profile_gpu(profile).rocm
    except UserError:
        return True  # a cuda profile of a GPU ckplan has no record of: CUDA


def allocator_setting_refused(profile: Profile, setup: TrainSetup) -> str | None:
    """The sentence refusing a stated --expandable-segments / --no-expandable-segments where no replay would
    read it (the reserve is then the fragmentation margin's); None where it is read or not stated."""
    stated = getattr(setup.training, "expandable_segments", None)
    if stated is None:
        return None
    flag = "--expandable-segments" if stated else "--no-expandable-segments"
    record = runtimes.of(setup.training)
    if profile.device.type != "cuda":
        why = f"this profile is of {profile.device.type}, which has no caching allocator to replay"
    elif setup.pipeline.fragmentation is not None:
        why = "--fragmentation states the reserve's margin, and no replay runs beside it"
    elif record.fsdp2_step_replayed and not replays(setup):
        why = ("the replay of torchtitan's FSDP2 step runs one stage under ZeRO 3, or one stage a rank of 1F1B or GPipe "
               "or several of interleaved 1F1B under ZeRO 3; this setup's reserve is the fragmentation margin's")
    elif record.step_replayed and setup.pipeline.chunks != 1:
        why = "the replay of ckplan's step runs one chunk a rank; this setup's reserve is the fragmentation margin's"
    else:
        return None
    return f"{flag} changes the caching allocator's replay, and {why}: drop it"


def job_gpus(profile: Profile, setup: TrainSetup) -> int:
    """The job's ranks: data-parallel (context-parallel ranks included) x tensor-parallel x pipeline."""
    from planner.cost.rules import profile_tp

    return setup.data_parallel.dp * profile_tp(profile) * setup.pipeline.stages


def reserved_bytes(replayed: Replayed, peak_bytes: int) -> int:
    """The stage's reserved peak: the replay's, and never below the cost model's allocated peak in
    2 MiB segments. The replay makes every byte the cost model counts, in FSDP2's order, so where the
    model's allocated peak is higher than the replay's the difference is timing (e.g. the sharded
    gradients, which the model holds all iteration and FSDP2 makes in the backward, after zero_grad
    freed them): a segment for it would count those bytes twice."""
    floor = -(-peak_bytes // allocator.ROUND_LARGE) * allocator.ROUND_LARGE
    return max(replayed.reserved_peak_bytes, floor)


# ---------------------------------------------------------------- the stage from the cost model's terms


def replays(setup: TrainSetup) -> bool:
    """Whether this replay orders the setup's step, under a runtime whose record says it runs FSDP2's
    (fsdp2_step_replayed): one stage and one microbatch, or several accumulated without a pipeline
    (fsdp2_accum.py), with its units charged per moment (fsdpunits.regathered_per_moment: ZeRO 3 resharded
    after forward, reduced every microbatch); or one stage a rank of 1F1B or
    GPipe, or several of interleaved 1F1B (fsdp2_chunks.py), with the weights gathered and the gradients
    kept whole through the microbatches (dataparallel.kept_whole: torchtitan beside a pipeline). Not the
    schedules that split a backward in two (ZB, ZBV) or overlap a forward with a backward (DualPipeV)."""
    from planner.cost.fsdp2_chunks import SCHEDULES

    pipeline, record = setup.pipeline, runtimes.of(setup.training)
    if not record.fsdp2_step_replayed or dataparallel.shard_size(setup) < 2:
        return False
    if pipeline.chunks == 1 and pipeline.stages == 1 and (pipeline.microbatches == 1 or accumulates(setup)):
        return fsdpunits.regathered_per_moment(setup, record.fsdp_units)
    schedules = ("1F1B", "GPipe") if pipeline.chunks == 1 else SCHEDULES
    return pipeline.schedule in schedules and dataparallel.kept_whole(setup) and setup.data_parallel.zero >= 3


def accumulates(setup: TrainSetup) -> bool:
    """Whether one stage accumulates gradients over several microbatches with no pipeline schedule driving
    it: FSDP2 resharding and reducing every microbatch (torchtitan's train loop at PP 1: fsdp2_accum.py), not
    kept whole through them (dataparallel.kept_whole: torch's pipelining at one stage)."""
    pipeline = setup.pipeline
    return (pipeline.stages == 1 and pipeline.chunks == 1 and pipeline.microbatches > 1
            and not dataparallel.kept_whole(setup))


def stage_of(plan: StagePlan, cost, *, stage: int, profile: Profile, setup: TrainSetup):
    """Rank `stage`'s replay input from the cost model's own terms (`cost`: its StageCost): each
    layer's kept bytes and its extra less FSDP2's moment (which the replay makes itself), the units
    and the held parameters as fsdpunits and dataparallel count them. Several microbatches accumulated
    without a pipeline: that stage in an Fsdp2Accumulated. A rank of several chunks: fsdp2_chunks.rank_of
    (an Fsdp2Rank)."""
    from planner.cost.assembly import option_indices
    from planner.cost.gathered import fsdp_unit_loss_bytes, kept_reduce_scatter_input_bytes
    from planner.cost.layers import layer_costs
    from planner.cost.schedules import build_schedule
    from planner.cost.terms import Context, stage_value

    if setup.pipeline.chunks > 1:
        from planner.cost.fsdp2_chunks import rank_of

        return rank_of(plan, cost, rank=stage, profile=profile, setup=setup)
    by_name = {layer.name: layer for layer in layer_costs(profile)}
    costs = [by_name[name] for name in plan.layers]
    record, pipeline = runtimes.of(setup.training), setup.pipeline
    piped = (pipeline.stages > 1 or pipeline.microbatches > 1) and not accumulates(setup)
    scratch_per_param = cost.step_scratch_bytes / max(1, sum(c.param_count for c in costs))
    made = chunk_layers(costs, option_indices(plan, costs), profile=profile, setup=setup, piped=piped,
                        scratch_per_param=scratch_per_param)
    last = stage == pipeline.stages - 1
    loss_extra = stage_value("extra", stage, Context(profile, setup)) - fsdp_unit_loss_bytes(profile, stage, setup) \
        if last else 0.0
    actions = ()
    if piped:
        from planner.cost.fsdp2_chunks import (
            replayed_microbatches as replayed,  # outputs kept: all, up to a bound
        )

        order = build_schedule(pipeline.schedule, num_ranks=pipeline.stages,
                               num_microbatches=replayed(pipeline, stage))
        actions = tuple((a.kind, a.microbatch) for a in order.actions[stage])
    kept_input = kept_reduce_scatter_input_bytes(profile, stage, setup)  # the replay makes it itself
    forward = loss_forward_program(profile, setup) if last else ()
    units = [layer.unit for layer in made.layers]
    built = Fsdp2Stage(
        layers=made.layers,
        kept_from_forward=frozenset(units) if piped else frozenset(
            fsdpunits.gathered_from_forward(units, record.fsdp_gathered_from_forward)),
        shard_group=dataparallel.shard_size(setup), reduce_ratio=made.reduce_ratio,
        # what static holds beyond the shards, states and gradients (none where they are all)
        buffer_bytes=int(cost.buffer_bytes - kept_input + max(0.0, cost.static_bytes - made.static_bytes)),
        # beyond the loss's result, which its forward program keeps (with_ends alike beside a pipeline)
        loss_kept_bytes=max(0, cost.kept_bytes - made.kept_bytes - program_kept_bytes(forward)),
        loss_extra_bytes=int(max(0.0, loss_extra)),
        actions=actions, root_units=made.root_units,
        keeps_last_input=record.keeps_last_reduce_scatter_input, loss_tensor_bytes=loss_tensor_bytes(profile, setup),
        loss_program=loss_program(profile, setup, int(max(0.0, loss_extra))) if last else (),
        loss_forward=forward)
    if accumulates(setup):  # torchtitan's train loop: the one-microbatch step, once a microbatch
        return Fsdp2Accumulated(built, microbatches=pipeline.microbatches)
    if not piped:
        return built
    from planner.cost.fsdp2_chunks import (
        one_stage_rank,  # beside a pipeline: torch's schedule drives it
    )

    return one_stage_rank(built, costs[-1], stage_index=stage, setup=setup, ends=cost.kept_bytes - made.kept_bytes,
                          first_layer=costs[0])
