"""A rank's reserved peak under Megatron-LM's interleaved schedule (several model chunks a rank: virtual pipeline
stages), from the caching allocator's replay of its step: reserve_megatron.py's static and optimizer events, each
chunk's passes as its _Step plays them, in the order forward_backward_pipelining_with_interleaving runs them. Read
at Megatron-LM d98e8a64 (megatron/core/pipeline_parallel/schedules.py; docs/framework-facts.md §52):

- the order (get_schedule_table 989-1016, get_pp_rank_microbatches 929-986): virtual microbatch k is microbatch
  and chunk of the table, which takes `group` (microbatch_group_size_per_vp_stage, default P: model_parallel_
  config.py 567-568) microbatches through chunk 0, then the same through chunk 1, ...; a backward runs chunk
  C - 1 - the table's chunk (get_model_chunk_id 1244-1249), each chunk's oldest input first (.pop(0),
  1432-1434); warm-up min((P - s - 1) * 2 + (C - 1) * group, M * C) forwards, then forward-backward pairs, then
  the cool-down backwards;
- the receives, one action ahead (recv_tensor_from_previous_stage 1285-1332: on the first rank the input of
  chunk c + 1 arrives P - 1 iterations after the last rank ran chunk c, which is the iteration before its own
  forward): the first input before the loop (1544); in the warm-up send_forward_recv_forward, blocking, the next
  input received before the sent output is deallocated (1680-1697), and at its last forward the first output
  gradient (1706-1728); in the steady state (overlap_p2p_comm, on by default: arguments.py 3118-3120) each
  forward's post receives the next forward's input and each backward's post the next backward's output
  gradient, and the output sent is deallocated only at the next forward's pre (1766-1768) or after the loop
  (1951); in the cool-down send_backward_recv_backward, blocking, its result the loop's variable until the next
  (2053-2058);
- what each chunk keeps: its model the last input it ran (set_input_tensor), its lists the inputs, the 1-element
  outputs and the received output gradients until their backward; the main loop's `input_tensor` the last input
  the warm-up received, `input_tensor_grad` the last backward's input gradient (retained on its input), each to
  the step's end; the buffers of the steady state's receives are not kept (fwd_recv_buffer and bwd_recv_buffer
  have one slot on every rank when group is P, cleared as filled: 1819-1823, 1883-1887);
- DDP wraps each chunk apart, in chunk order (training.py wrap_model_chunks_with_ddp 2310-2329): each its own
  param_data and grad_data (reserve_megatron.static_events, chunk by chunk).

Not replayed: --overlap-p2p-communication-warmup-flush (off by default) and --no-overlap-p2p-communication (the
warm-up's and steady state's blocking sends; listed as not modelled by the Megatron-LM reader), a group other than P
(--microbatch-group-size-per-virtual-stage, listed), and MoE's combined 1F1B (overlap_moe_expert_parallel_comm).
Nothing here reads a file or prints.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from planner.cost import allocator
from planner.cost.allocator import Event, Replayed
from planner.cost.reserve import plan_records
from planner.cost.reserve_fsdp2 import expandable_segments
from planner.cost.reserve_megatron import (
    MAX_STEPS,
    STEPS,
    MegatronStatic,
    _Holders,
    _output_bytes,
    _Step,
    adam_state_events,
    first_forward_events,
    last_stage_loss,
    static_events,
    static_of,
)
from planner.schema import AllocRecord, LayerProfile, Profile, StagePlan, TrainSetup

# Past this many microbatches the replay runs a multiple of the group that covers the warm-up and two steady
# rounds (replayed_microbatches): nothing a microbatch makes outlives its backward under Megatron-LM (the sent
# outputs are deallocated, no output is kept to the step's end), so the steady state repeats.
REPLAYED_MAX = 64


def schedule_table(num_microbatches: int, chunks: int, group: int) -> list[tuple[int, int]]:
    """get_schedule_table: (microbatch, chunk) per virtual microbatch, `group` microbatches a chunk in turn."""
    table = []
    for start in range(0, num_microbatches, group):
        stop = num_microbatches if start + group >= num_microbatches else start + group
        table += [(mb, chunk) for chunk in range(chunks) for mb in range(start, stop)]
    return table


def interleaved_order(stages: int, stage: int, chunks: int, num_microbatches: int,
                      group: int | None = None) -> tuple[list[tuple[int, int]], list[tuple[int, int]], int]:
    """Rank `stage`'s forwards and backwards in run order, each (chunk, microbatch), and its warm-up count."""
    group = group or stages
    table = schedule_table(num_microbatches, chunks, group)
    total = len(table)
    warmup = min(total, (stages - stage - 1) * 2 + (chunks - 1) * group)
    forwards = [(chunk, mb) for mb, chunk in table]
    backwards = [(chunks - 1 - chunk, mb) for mb, chunk in table]
    return forwards, backwards, warmup


def replayed_microbatches(num_microbatches: int, stages: int, group: int | None = None) -> int:
    """All M up to REPLAYED_MAX; past it four groups (the warm-up is under two groups' microbatches, (P - s - 1) *
    2 + (C - 1) * group virtual ones of C a microbatch, and two more run steady rounds)."""
    group = group or stages
    return num_microbatches if num_microbatches <= REPLAYED_MAX else min(num_microbatches, 4 * group)


class _Rank:
    """A rank's chunks, each its _Step, run in the interleaved order."""

    def __init__(self, chunks: Sequence[_Step]) -> None:
        self.chunks = chunks

    def run(self, forwards, backwards, warmup: int) -> None:
        total, steps = len(forwards), self.chunks
        remaining = total - warmup
        self.receive_input(forwards, 0, var=False)  # input_tensors[0].append(recv_forward(...))
        for k in range(warmup):  # blocking sends: the next input received, then the output deallocated
            c, mb = forwards[k]
            self.forward(c, mb)
            self.receive_input(forwards, k + 1, var=True)
            if steps[c].loss is None:
                steps[c].drop_output(mb)
            if k == warmup - 1 and remaining:
                self.receive_output_grad(backwards, 0, var=False)
        sent = None  # the steady state's last output, deallocated at the next forward's pre
        for k in range(remaining):
            if sent is not None:
                steps[sent[0]].drop_output(sent[1])
            c, mb = forwards[warmup + k]
            self.forward(c, mb)
            self.receive_input(forwards, warmup + k + 1, var=False)
            sent = (c, mb) if steps[c].loss is None else None
            self.backward(backwards[k])
            self.receive_output_grad(backwards, k + 1, var=False)
        if sent is not None:
            steps[sent[0]].drop_output(sent[1])
        if not remaining:
            self.receive_output_grad(backwards, 0, var=True)
        for k in range(remaining, total):  # blocking: the result the loop's variable until the next
            self.backward(backwards[k])
            self.receive_output_grad(backwards, k + 1, var=True)
        steps[0].release_variables()

    def forward(self, c: int, mb: int) -> None:
        """A chunk's forward; the loss's chunk drops its logits as the loss is made (the GPT model's forward
        returns the loss), before anything is sent or received."""
        self.chunks[c].run_forward(mb)
        if self.chunks[c].loss is not None:
            self.chunks[c].drop_output(mb)

    def backward(self, action: tuple[int, int]) -> None:
        c, mb = action
        step = self.chunks[c]
        local = ("in", step.key(mb))  # backward_step_helper's local input_tensor: held until its backward returns
        if not step.first:
            step.holders.hold(local, "local")
        step.pop_input(mb, var=False)
        step.run_backward(mb)
        if not step.first:
            step.holders.drop(local, "local")
        if step.loss is None:
            step.free_output_grad(mb)  # the helper's local: let go once its backward returns

    def receive_input(self, forwards, k: int, *, var: bool) -> None:
        """The input of forward k, where it is received (not the first rank's chunk 0); `var`: the warm-up's
        input_tensor variable takes the result (None where nothing is received)."""
        if k < len(forwards) and not self.chunks[forwards[k][0]].first:
            self.chunks[forwards[k][0]].receive_input(forwards[k][1], var=var)
        elif var:
            self.chunks[0]._drop_all("input_var")

    def receive_output_grad(self, backwards, k: int, *, var: bool) -> None:
        """The output gradient of backward k, where it is received (not the last rank's last chunk); `var`: the
        cool-down's output_tensor_grad variable takes the result (None where nothing is received)."""
        if k < len(backwards) and self.chunks[backwards[k][0]].loss is None:
            self.chunks[backwards[k][0]].receive_output_grad(backwards[k][1], var=var)
        elif var:
            self.chunks[0]._drop_all("ograd_var")


def rank_player(chunks: Sequence[tuple[Sequence[LayerProfile], Sequence[str], Sequence[AllocRecord]]], *,
                static: MegatronStatic, stage: int, stages: int, num_microbatches: int, loss: AllocRecord | None,
                keeps_logits: bool = False) -> tuple[list[Event], Callable[[int], list[Event]]]:
    """The rank's static allocations (each chunk's DDP buffers in turn), and the function making interleaved step
    `index`'s events (step 0 makes the workspaces at its first forward and Adam's state after its backwards);
    `chunks`: each chunk's layers, options and records, chunk 0 first; `loss`: the last rank's (last_stage_loss),
    on its last chunk; `keeps_logits`: it keeps the logits."""
    holders = _Holders([])
    forwards, backwards, warmup = interleaved_order(stages, stage, len(chunks),
                                                    replayed_microbatches(num_microbatches, stages))
    last = len(chunks) - 1

    def one_step(index: int) -> list[Event]:
        events = holders.events = first_forward_events(static) if index == 0 else []
        made = [_Step(layers, options, records, loss=loss if c == last and stage == stages - 1 else None,
                      first=stage == 0 and c == 0, input_bytes=layers[0].input_bytes, events=events,
                      holders=holders, step=index, chunk=c, keeps_logits=keeps_logits)
                for c, (layers, options, records) in enumerate(chunks)]
        _Rank(made).run(forwards, backwards, warmup)
        if index == 0:
            events += adam_state_events(static)
        return events

    return static_events(static), one_step


def rank_events(chunks: Sequence[tuple[Sequence[LayerProfile], Sequence[str], Sequence[AllocRecord]]], *,
                static: MegatronStatic, stage: int, stages: int, num_microbatches: int,
                loss: AllocRecord | None, steps: int = STEPS, keeps_logits: bool = False) -> list[Event]:
    """The rank's static allocations, then `steps` interleaved steps (rank_player's)."""
    events, one_step = rank_player(chunks, static=static, stage=stage, stages=stages,
                                   num_microbatches=num_microbatches, loss=loss, keeps_logits=keeps_logits)
    for index in range(steps):
        events += one_step(index)
    return events


def replay_rank(plan: StagePlan, cost, *, rank: int, profile: Profile, setup: TrainSetup,
                cap_bytes: int | None = None) -> Replayed | None:
    """Rank `rank`'s replay (`plan`: its StagePlan, chunk by chunk; `cost`: its StageCost); None where a layer has
    no record for its option, or the last rank's logits are not known."""
    chunks = []
    for names in plan.chunks:
        layers, options, records = plan_records(plan, profile, names)
        if records is None:
            return None
        chunks.append((layers, options, records))
    pipeline = setup.pipeline
    loss, keeps_logits = None, False
    if rank == pipeline.stages - 1:
        logits = _output_bytes(chunks[-1][2][-1])
        if not logits:
            return None
        loss, keeps_logits = last_stage_loss(profile, setup, logits)
    flat = [layer for layers, _, _ in chunks for layer in layers]
    static = static_of(flat, cost, stage=rank, profile=profile, setup=setup,
                       chunk_layers=tuple(len(layers) for layers, _, _ in chunks))
    events, one_step = rank_player(chunks, static=static, stage=rank, stages=pipeline.stages,
                                   num_microbatches=pipeline.microbatches, loss=loss, keeps_logits=keeps_logits)
    return allocator.settled_replay(events, one_step, min_steps=STEPS, max_steps=MAX_STEPS,
                                    expandable=expandable_segments(profile, setup), cap_bytes=cap_bytes)
