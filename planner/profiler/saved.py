"""What each layer keeps alive for backward: the `act_bytes` of the cost model.

One grad-enabled forward of the whole chain, layer by layer, with
`saved_tensors_hooks` recording the storage of every tensor autograd saves. A
storage is charged to the first layer that saves it (a ReLU saves its output and
the next Linear saves that same tensor as its input: one cost, the ReLU's), and
only if it is per-microbatch data: created during this forward, or the batch
itself. That leaves out parameters, buffers, views of them (Linear saves
`weight.t()`) and anything a layer caches between calls.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn

from planner.profiler.storages import StorageTracker, storage_key, storage_nbytes
from planner.profiler.userfault import blame
from planner.runtime.recompute import layer_runner

Layers = list[tuple[str, nn.Module]]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class SavedBytes:
    act_bytes: list[int]  # per layer, each storage charged once
    input_in_act_bytes: list[int]  # the part of act_bytes that is the layer's own input
    loss_bytes: int  # what the loss saves beyond the final output and what layers charged
    # per layer, each recompute option asked for: its kept bytes as full's are charged (its input
    # when it holds it, though an earlier layer saves it too; not its output), and the part of
    # them that is the layer's own input
    option_bytes: list[dict[str, int]] = field(default_factory=list)
    option_input_bytes: list[dict[str, int]] = field(default_factory=list)
    # per layer, the bytes of the last storage it saves: the first its backward reads
    last_saved_bytes: list[int] = field(default_factory=list)
    # per layer, its input's storage where it saves it and the layer before it already saved (and paid
    # for) it: left out of act_bytes here, the layer's own where its input is not that layer's; 0 where one
    # of its options does not keep its input (full does: a checkpoint recomputes from it)
    input_shared_bytes: list[int] = field(default_factory=list)


def saved_bytes(layers: Layers, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: LossFn, *,
                options: Sequence[Sequence[str]] = ()) -> SavedBytes:
    """options[i]: the recompute options of layer i to count besides none (none: no others)."""
    charged: set[int] = set()  # storages some earlier layer already pays for
    batch = {storage_key(inputs), storage_key(targets)}
    act, input_in_act, option_bytes, option_input, last, shared = [], [], [], [], [], []
    earlier: set[int] = set()  # what was charged before the layer before this one ran
    outputs = []  # holding every output keeps every graph, so no saved storage is freed
    with torch.enable_grad(), StorageTracker() as tracker:

        def per_microbatch(key: int) -> bool:
            return key in tracker.created or key in batch

        current = inputs
        for index, (name, layer) in enumerate(layers):
            before = set(charged)
            with blame(f"layer {name!r} (grad-enabled forward)"):
                saved, output = _saved_by(partial(_plain, layer), current)
            key = storage_key(current)
            shared.append(saved[key] if key in saved and key in before - earlier and per_microbatch(key) else 0)
            earlier = before
            mine = _charge(saved, charged, per_microbatch)
            act.append(sum(mine.values()))
            last.append(next(reversed(mine.values()), 0))
            input_in_act.append(mine.get(key, 0))
            option_bytes.append({})
            option_input.append({})
            for option in options[index] if index < len(options) else ():
                with blame(f"layer {name!r} (grad-enabled forward, recompute option {option})"):
                    saved, option_output = _saved_by(partial(_under, layer, option), current)
                # As full keeps its input: the input when the option holds it, whoever else saved it
                # (an earlier layer run under none, say, may not be), never its own output, which the
                # next layer's input or the stage's output pays for.
                paid = (before - {storage_key(current)}) | {storage_key(option_output)}
                kept = _charge(saved, paid, per_microbatch)  # a copy: the options are alternatives
                option_bytes[-1][option] = sum(kept.values())
                option_input[-1][option] = kept.get(storage_key(current), 0)
            if not all(option_input[-1].values()):  # an option that drops its input leaves it the layer before's
                shared[-1] = 0
            outputs.append(output)
            current = output
        # The final output is the last layer's output_bytes, not the loss's; the targets it saves, the batch's
        # (rules.batch_bytes: the schedule holds them; docs/published-runs.md §44.smallfix)
        charged |= {storage_key(current), storage_key(targets)}
        with blame("loss_fn(output, target)"):
            saved, _ = _saved_by(lambda out, observe: loss_fn(out, targets), current)
        loss = sum(_charge(saved, charged, per_microbatch).values())
    return SavedBytes(act_bytes=act, input_in_act_bytes=input_in_act, input_shared_bytes=shared, loss_bytes=loss,
                      option_bytes=option_bytes, option_input_bytes=option_input, last_saved_bytes=last)


def _plain(layer: nn.Module, x: torch.Tensor, observe: Callable[[torch.Tensor], None]) -> torch.Tensor:
    return layer(x)


def _under(layer: nn.Module, option: str, x: torch.Tensor, observe: Callable[[torch.Tensor], None]) -> torch.Tensor:
    return layer_runner(layer, option, observe=observe)(x)


def _saved_by(fn: Callable[[torch.Tensor, Callable[[torch.Tensor], None]], torch.Tensor],
              x: torch.Tensor) -> tuple[dict[int, int], torch.Tensor]:
    """Run fn(x, observe); return {storage key: bytes} of what autograd saved, and of what fn
    told observe() it keeps (a selective checkpoint's saved outputs), and the output. Only what is
    still alive when fn returns: a graph branch whose output nothing uses (a MoE router's scores
    that only pick the top-k indices, which carry no gradient) frees what it saved, and a later
    storage may then reuse its key."""
    saved: dict[int, tuple[int, weakref.ref]] = {}

    def record(tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()  # kept by torch while its memory lives: the weakref dies with it
        saved[storage._cdata] = (storage_nbytes(tensor), weakref.ref(storage))

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        record(tensor)
        return tensor  # keep the tensor itself: memory stays exactly as without hooks

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = fn(x, record)
    return {key: nbytes for key, (nbytes, alive) in saved.items() if alive() is not None}, output


def _charge(saved: dict[int, int], charged: set[int], per_microbatch: Callable[[int], bool]) -> dict[int, int]:
    """The saved storages this layer pays for; marks them charged."""
    mine = {key: nbytes for key, nbytes in saved.items() if key not in charged and per_microbatch(key)}
    charged.update(mine)
    return mine
