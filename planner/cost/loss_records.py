"""The last stage's loss as the allocator replay of ckplan's step plays it (reserve.replay_stage): the profile's
own record where its profiler ran the loss (measured and fake profiles: allocseq.record_loss), else, for an
analytic profile, a record made from the loss terms the cost model charges the stage (rules.loss_kept_bytes,
rules.stage_constant_transient_bytes: the runtime's loss region, plain, compiled, chunked or Megatron-LM's
vocab-parallel, or the profile's own loss_bytes and loss_transient_bytes outside bf16).

That record, per microbatch: the forward makes what the loss keeps, its saved tensor (K - 4 B) and the loss value
(4 B, the output, kept to the step's end as a measured record's is); the backward makes its scratch (the transient
beyond the logits' gradient), then the logits' gradient (the last layer's output bytes, handed back), then frees
the saved tensor and the scratch, so that the backward's peak is K + the transient, the cost model's. Where the
loss writes the gradient into the logits' own storage (rules.loss_holds_logits: Transformer Engine's fused
cross-entropy) no gradient is made; the transient is scratch. Nothing here reads a file or prints.
"""

from __future__ import annotations

from planner.cost import rules
from planner.schema import AllocRecord, Profile, TrainSetup

LOSS_VALUE_BYTES = 4  # the fp32 scalar loss (rules.loss_kept_bytes's + 4)


def stage_loss(profile: Profile, setup: TrainSetup) -> AllocRecord | None:
    """The last stage's loss record: the profile's own where it has one, else one from the charged terms
    (analytic profiles); None for a profile with no layers."""
    if profile.loss_alloc is not None:
        return profile.loss_alloc
    if profile.source != "analytic" or not profile.layers:
        return None
    last = setup.pipeline.stages - 1
    return loss_record(kept=rules.loss_kept_bytes(profile, last, setup),
                       transient=rules.stage_constant_transient_bytes(profile, last, setup),
                       grad=0 if rules.loss_holds_logits(profile, setup) else profile.layers[-1].output_bytes)


def loss_record(*, kept: int, transient: int, grad: int) -> AllocRecord:
    """The record for a loss that keeps `kept` bytes (its saved tensor and the 4 B value), makes `transient` in its
    backward, `grad` of it the logits' gradient it hands back (0: none made)."""
    saved = max(0, kept - LOSS_VALUE_BYTES)
    forward = [saved, LOSS_VALUE_BYTES] if saved else [LOSS_VALUE_BYTES]
    output = len(forward)
    scratch = max(0, transient - grad)
    backward: list[int] = []
    next_id = output + 1
    scratch_id = grad_id = 0
    if scratch:
        backward.append(scratch)
        scratch_id, next_id = next_id, next_id + 1
    if grad:
        backward.append(grad)
        grad_id = next_id
    backward += [-1] if saved else []
    backward += [-scratch_id] if scratch_id else []
    return AllocRecord(forward=forward, backward=backward, output=output, input_grad=grad_id)


def input_pass_retained_bytes(profile: Profile, setup: TrainSetup) -> int:
    """What the last stage's split input pass holds beyond the loss's backward peak as the record has it: torch's
    stage_backward_input runs the loss's backward with retain_graph=True (torch 2.13.0 cf30153c
    distributed/pipelining/_backward.py 246-250), so every tensor the loss's forward saved stays until the pass detaches
    the loss at its end (263-265), where a full backward frees each as its node runs (docs/framework-facts.md §856).
    The record's backward replayed with those frees deferred, its peak less the peak with them (0 where the loss
    frees nothing it saved before its peak)."""
    record = stage_loss(profile, setup)
    if record is None:
        return 0
    made = [event for event in record.forward if event > 0]
    return max(0, _backward_peak(record.backward, made, retained=True) - _backward_peak(record.backward, made,
                                                                                          retained=False))


def _backward_peak(events: list[int], made: list[int], *, retained: bool) -> int:
    """The highest a backward's own allocations stand over what was live before it (`made`: the forward's
    allocations, ids 1..len(made), whose frees count unless `retained`)."""
    sizes = {idx: size for idx, size in enumerate(made, start=1)}
    live = peak = 0
    for event in events:
        if event > 0:
            sizes[len(sizes) + 1] = event
            live += event
            peak = max(peak, live)
        elif -event > len(made) or not retained:
            live -= sizes.get(-event, 0)
    return peak
