"""The caching allocator's replay of a stage whose offloaded layers are Transformer Engine's window
(te_offload.plan_window: the block's first N layers, one stage, the runtime's record `te_window_offload`), as
TE v2.9's `AsyncDoubleBufferGroupOffloadHandler` runs it without double buffering (megatron-core's default), read
at TransformerEngine v2.9 (git 70f53666), transformer_engine/pytorch/cpu_offload.py (docs/framework-facts.md §107,
§112, §377-§379):

- group g (the block's layer g) saves its tensors on the device as any layer's forward makes them: tensor_push
  (356-423) keeps a reference in `tensor_tag_to_buf`, the layer's input among them where the layer saves it
  (TE's LayerNormLinear marks its input, §107);
- the copies out (bulk_offload_group 451-488: `cpu_backup.copy_(..., non_blocking)` on the d2h stream, no
  record_stream, offload 243-257) replace the saved state by the host copy, the device tensor still referenced by
  `tensor_tag_to_buf`;
- at the end of layer window[g]'s forward (synchronize_on_group_commit_forward 516-532) the compute stream waits
  for the d2h stream and the references are dropped (`tensor_tag_to_buf[tag] = None`): group g's blocks go back
  to the cache there and then, on the compute stream, with no event to wait for;
- before layer window[g]'s backward (on_group_commit_backward 641-648, GroupCommitFunction.backward 194-199)
  group g is reloaded (bulk_reload_group 560-631) into buffers `torch.empty_like` makes on the compute stream
  (579-582), one a saved tensor, in the order the tensors were pushed (the dict's); autograd drops them after
  layer g's own backward (tensor_pop 425-449 hands them to it; nothing else keeps them).

So where ckplan's per-layer option (reserve._Step) holds each offloaded layer's blocks to its own backward
(record_stream: cached only once the copy is done) and allocates its copies back there, the window frees them at
its end and allocates the copies back window[g] - g layers ahead of the layer's backward. The order within a group
is the layer's record's (its input first, then its saved allocations as made): TE pushes as autograd saves, which
the record does not show.

TE v2.10's DefaultOffloadSynchronizer (the record's te_window_handler "v2.10", which Megatron-LM d98e8a64 calls;
docs/framework-facts.md §425-§428) plays the same requests on its own map (te_offload.window_map: window[g] =
L - N - 1 + g, freed after that layer's forward, `release_activation_forward_gpu_memory` before the next's, and
reloaded before its backward, `start_reload` 317-348 into `empty_like` blocks on the compute stream), and holds
what it reloaded to the layer's end: `pop_tensor` (373-395) hands autograd the tensor but keeps it in
`bwd_gpu_tensor_group`, dropped only by `release_all_memory` (397-403) at the next layer's `bwd_step` (482-489,
before that layer's reloads: 586-593) or, after the block's first layer, at the backward's end
(`finish_part_of_bwd` 499-510). Nothing here reads a file or prints.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.cost import te_offload
from planner.cost.allocator import Alloc, Event, Free
from planner.cost.reserve import _alive, _keeps_input, _sizes
from planner.cost.reserve import _Step as _LayerPasses
from planner.schema import AllocRecord, LayerProfile


class WindowPasses(_LayerPasses):
    """reserve._Step with the layers `window` = (block, N) names (te_offload.window_layers: the stage's indices of
    the block's layers, and N) offloaded as Transformer Engine's window runs them."""

    def __init__(self, layers: Sequence[LayerProfile], options: Sequence[str], records: Sequence[AllocRecord],
                 loss: AllocRecord | None, events: list[Event], *, window: tuple[list[int], int],
                 handler: str = "v2.9") -> None:
        super().__init__(layers, options, records, loss, events)
        block, count = window
        self.block = block[:count]  # group g's layer
        self.whole = set(block)  # the layers whose bwd_step releases the previous one's state (v2.10)
        self.holds = handler == te_offload.V210  # reloads held to the layer's end
        self.pending: list[tuple] = []  # v2.10: the reloaded blocks bwd_gpu_tensor_group holds
        at = te_offload.window_map(len(block), count, handler=handler)
        self.ends = {block[at[g]]: g for g in range(count)}  # the layer whose forward ends group g (and backward reloads it)
        self.group: dict[tuple, list[tuple[tuple, int]]] = {}  # (mb, g) -> its device tensors' keys and bytes
        self.reloaded: dict[tuple, dict[tuple, tuple]] = {}  # (mb, layer) -> each saved key -> its reload's

    def group_tensors(self, mb, i: int) -> list[tuple[tuple, int]]:
        """Layer i's saved tensors of microbatch `mb` (keys and bytes): its input where it keeps it (the previous
        layer's output), then what its recorded forward leaves besides its output."""
        record, found = self.records[i], []
        before = self.records[i - 1] if i > 0 else None
        if before is not None and before.output and _keeps_input(self.layers[i], self.options[i], record):
            found.append(((mb, i - 1, before.output), _sizes(before.forward)[before.output]))
        sizes = _sizes(record.forward)
        found += [((mb, i, ident), sizes[ident]) for ident in _alive(record.forward) if ident != record.output]
        return found

    def _after_forward(self, mb, i: int, started: float) -> None:
        if i in self.block:  # pushed: held by tensor_tag_to_buf while its copy runs
            self.group[(mb, self.block.index(i))] = self.group_tensors(mb, i)
        if i in self.ends:  # the window's end: the references dropped, the blocks cached at once
            self.events += [Free(key) for key, _ in self.group.get((mb, self.ends[i]), [])]

    def _reloads(self, mb, i: int) -> dict[tuple, tuple]:
        if self.holds and i in self.whole:  # v2.10's bwd_step: the previous layer's state released first
            self._release()
        if i in self.ends:  # the group's reload, into buffers made on the compute stream
            g = self.ends[i]
            back = {}
            for key, size in self.group.pop((mb, g), []):
                back[key] = ("back", *key)
                self.events.append(Alloc(back[key], size))
            self.reloaded[(mb, self.block[g])] = back
        back = self.reloaded.pop((mb, i), {})
        if self.holds and back:  # autograd's frees of them do nothing; bwd_gpu_tensor_group still holds them
            self.pending += list(back.values())
            return {key: ("held", *copy) for key, copy in back.items()}
        return back

    def _release(self) -> None:
        self.events += [Free(key) for key in self.pending]
        self.pending = []

    def backward(self, mb: int) -> None:
        super().backward(mb)
        self._release()  # v2.10: finish_part_of_bwd, the backward's end (nothing pending under v2.9)


def layer_passes(layers: Sequence[LayerProfile], options: Sequence[str], records: Sequence[AllocRecord],
                 loss: AllocRecord | None, events: list[Event], *, window: tuple[list[int], int] | None,
                 handler: str = "v2.9") -> _LayerPasses:
    """The layers' passes: Transformer Engine's window where `window` names one (run by `handler`, the record's
    te_window_handler), else reserve._Step's (ckplan's per-layer offload, held to each layer's backward)."""
    if window is None:
        return _LayerPasses(layers, options, records, loss, events)
    return WindowPasses(layers, options, records, loss, events, window=window, handler=handler)
