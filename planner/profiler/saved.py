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

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from planner.profiler.storages import StorageTracker, storage_key, storage_nbytes
from planner.profiler.userfault import blame

Layers = list[tuple[str, nn.Module]]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class SavedBytes:
    act_bytes: list[int]  # per layer, each storage charged once
    input_in_act_bytes: list[int]  # the part of act_bytes that is the layer's own input
    loss_bytes: int  # what the loss saves beyond the final output and what layers charged


def saved_bytes(layers: Layers, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: LossFn) -> SavedBytes:
    charged: set[int] = set()  # storages some earlier layer already pays for
    batch = {storage_key(inputs), storage_key(targets)}
    act, input_in_act = [], []
    outputs = []  # holding every output keeps every graph, so no saved storage is freed
    with torch.enable_grad(), StorageTracker() as tracker:

        def per_microbatch(key: int) -> bool:
            return key in tracker.created or key in batch

        current = inputs
        for name, layer in layers:
            with blame(f"layer {name!r} (grad-enabled forward)"):
                saved, output = _saved_by(layer, current)
            mine = _charge(saved, charged, per_microbatch)
            act.append(sum(mine.values()))
            input_in_act.append(mine.get(storage_key(current), 0))
            outputs.append(output)
            current = output
        # The final output is the last layer's output_bytes, not the loss's.
        charged.add(storage_key(current))
        with blame("loss_fn(output, target)"):
            saved, _ = _saved_by(lambda out: loss_fn(out, targets), current)
        loss = sum(_charge(saved, charged, per_microbatch).values())
    return SavedBytes(act_bytes=act, input_in_act_bytes=input_in_act, loss_bytes=loss)


def _saved_by(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> tuple[dict[int, int], torch.Tensor]:
    """Run fn(x); return {storage key: bytes} of what autograd saved, and the output."""
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved[storage_key(tensor)] = storage_nbytes(tensor)
        return tensor  # keep the tensor itself: memory stays exactly as without hooks

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = fn(x)
    return saved, output


def _charge(saved: dict[int, int], charged: set[int], per_microbatch: Callable[[int], bool]) -> dict[int, int]:
    """The saved storages this layer pays for; marks them charged."""
    mine = {key: nbytes for key, nbytes in saved.items() if key not in charged and per_microbatch(key)}
    charged.update(mine)
    return mine
