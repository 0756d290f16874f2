"""FSDP2's step with gradient accumulation and no pipeline (one stage, several microbatches), as the
caching allocator's replay runs it: the one-microbatch step of fsdp2_events.py played once per microbatch,
the sharded gradients accumulated between them as FSDP2 accumulates them, the optimizer step once.
Read at torchtitan 8570415c (2025-06-05, "Support gradient accumulation", #1238), 2c8b5947 (2025-08-08) and
b5bcd76c (2026-08-21); torch 2.6.0 (git 2236df17) and 2.13.0 (docs/framework-facts.md §75):

- torchtitan's train_step (2c8b5947 torchtitan/train.py 457-490; b5bcd76c torchtitan/trainer.py 842-956):
  `optimizers.zero_grad()` once, then `gradient_accumulation_steps` times forward_backward_step (the model's
  forward, the loss, `del pred`, `loss.backward()`), then clip_grad_norm_ and `optimizers.step()` once.
  torchtitan turns neither FSDP2's gradient sync nor its reshard after backward off between microbatches
  (no `set_requires_gradient_sync` / `set_reshard_after_backward` in its train loop at either commit; b5bcd76c's
  chunked loss turns the LM head's off and on again within one microbatch, components/loss.py 660-705): every
  microbatch's backward reshards and reduce-scatters every unit, as the one-microbatch step does.
- FSDP2's foreach_reduce (torch 2.6.0 _fsdp_collectives.py 382-383, 441-464; 2.13.0 612-616, 710-754): the
  reduce-scatter output is allocated on the reduce-scatter stream; where the parameter's sharded `.grad` is
  None (the first microbatch after zero_grad(set_to_none)) it becomes that gradient, a view of the output;
  else it is added into the gradient (`sharded_param.grad._local_tensor += new_sharded_grad`) and the output,
  a local of foreach_reduce, is freed when it returns: on the stream that allocated it, no record_stream.
  So between microbatches the step holds the fp32 sharded gradients (made by the first microbatch's backward)
  and nothing else of FSDP2's: the last reduce-scatter input is dropped by the root's final callback at each
  backward's end, and every unit is resharded in its post-backward.

torchtitan 9dec370 and bbb1b616 run one microbatch a step without a pipeline (no accumulation loop: 9dec370
train.py 253-323; bbb1b616 torchtitan/train.py 311-370): several microbatches on one stage under them are
refused (runnable.accumulation_refused), so the replay plays the versions that accumulate. Not
replayed: b5bcd76c holding every microbatch's input ids on the device to the step's end (trainer.py 880-887:
`input_dict[key] = value.to(device)` into the step's list; 8 B a token), among the buffers as one batch.
Nothing here reads a file or prints.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost import allocator
from planner.cost.allocator import Alloc, Event, Free, Replayed
from planner.cost.fsdp2_events import MAX_STEPS, STEPS, Fsdp2Stage, _Step, step_events

# The microbatches the replay plays a step: the first makes the sharded gradients, the second the reduce-scatter
# outputs it adds into them (new blocks of the reduce-scatter stream, freed at once), the third reuses what the
# second left cached; every later one plays from the state the one before it left, so replaying more moves no
# peak (tests/test_fsdp2_accum.py checks 3 against 4-8). The replay's cost is linear in them.
REPLAYED_MICROBATCHES = 3


@dataclass(frozen=True)
class Fsdp2Accumulated:
    """One stage's step over `microbatches` microbatches (gradient accumulation, no pipeline): `stage` as the
    one-microbatch step takes it (its `actions` empty)."""

    stage: Fsdp2Stage
    microbatches: int


def step_of(accumulated: Fsdp2Accumulated, *, first: bool) -> list[Event]:
    """One step's events, min(M, REPLAYED_MICROBATCHES) microbatches (`first`: the optimizer's state made)."""
    events: list[Event] = []
    microbatches = min(accumulated.microbatches, REPLAYED_MICROBATCHES)
    _AccumulatedStep(accumulated.stage, events, makes_state=first, microbatches=microbatches).run()
    return events


def accumulated_events(accumulated: Fsdp2Accumulated, *, steps: int = STEPS) -> list[Event]:
    """The stage's static state (the shards, the buffers), then `steps` steps."""
    events = step_events(accumulated.stage, steps=0)
    for step in range(steps):
        events += step_of(accumulated, first=step == 0)
    return events


def replay(accumulated: Fsdp2Accumulated, *, expandable: bool = False, cap_bytes: int | None = None,
           perturb: allocator.Perturb | None = None) -> Replayed:
    """The allocator's peaks over the static state and the steps, played until a step raises neither peak
    (at least STEPS, at most MAX_STEPS: allocator.settled_replay; `perturb` its)."""
    return allocator.settled_replay(step_events(accumulated.stage, steps=0),
                                    lambda index: step_of(accumulated, first=index == 0),
                                    min_steps=STEPS, max_steps=MAX_STEPS, expandable=expandable,
                                    cap_bytes=cap_bytes, perturb=perturb)


class _AccumulatedStep(_Step):
    """The one-microbatch step (_Step.run: zero_grad, forward, loss, backward, optimizer step) played once a
    microbatch, the optimizer step at the last only; from the second microbatch on, zero_grad frees nothing
    (it ran once, at the step's start) and each unit's reduce-scatter output is added into its sharded gradient
    and freed (accumulating)."""

    def __init__(self, stage: Fsdp2Stage, events: list[Event], *, makes_state: bool, microbatches: int) -> None:
        super().__init__(stage, events, makes_state=makes_state)
        self.microbatches, self.microbatch = microbatches, 0

    def run(self) -> None:
        for microbatch in range(self.microbatches):
            self.microbatch, start = microbatch, len(self.events)
            super().run()
            if self.microbatch:
                self.events[start:] = accumulating(self.events[start:], self.microbatch)

    def optimizer_step(self) -> None:
        if self.microbatch == self.microbatches - 1:
            super().optimizer_step()


def accumulating(events: list[Event], microbatch: int) -> list[Event]:
    """A later microbatch's events: the sharded gradients neither freed (zero_grad ran once) nor made again; each
    unit's reduce-scatter output made on the stream the gradient was (the reduce-scatter stream) and freed once
    added into it."""
    out: list[Event] = []
    for event in events:
        key = getattr(event, "key", None)  # Sync has none
        if not (isinstance(key, tuple) and key and key[0] == "sharded_grad"):
            out.append(event)
        elif isinstance(event, Alloc):
            output = ("reduce_output", microbatch, *key[1:])
            out += [Alloc(output, event.nbytes, event.stream), Free(output)]
    return out
