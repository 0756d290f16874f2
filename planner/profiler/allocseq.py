"""The order in which a layer's storages are allocated and freed: what the caching allocator
replay (planner/cost/reserve.py) needs beyond the byte totals the profile already holds.

A storage is the unit, as everywhere in ckplan's memory (storages.py): the recorder sees every
storage an op creates (a TorchDispatchMode, as StorageTracker) and, through a weak reference
to the storage, the moment its memory is freed. One forward and one backward of a layer, on
the same input and output gradient the profiler measures it on, give a schema.AllocRecord:
the events in order, which id is the output (the next layer's input, whose life the stage
decides) and which the input's gradient (the previous layer's output gradient).

Runs under FakeTensorMode as well as on real tensors: the events are the storages' bytes, not
their contents.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from functools import partial

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from planner.schema import OPTION_FULL, OPTION_NONE, OPTION_OFFLOAD, AllocRecord, LayerProfile


class AllocRecorder(TorchDispatchMode):
    """Every storage an op creates inside the region, as an event (its bytes), and its free
    (minus its id) when the memory goes. Storages made before entry are never recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[int] = []
        self.ids: dict[int, int] = {}  # storage key -> id while alive
        self._refs: dict[int, weakref.ref] = {}
        self._next = 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        fresh = func is torch.ops.aten.lift_fresh.default
        arg_keys = set() if fresh else {t.untyped_storage()._cdata for t in _tensors((args, kwargs))}
        for tensor in _tensors(result):
            self._track(tensor.untyped_storage(), arg_keys)
        return result

    def __exit__(self, *exc_info):
        self._refs.clear()  # no callback fires after the region
        return super().__exit__(*exc_info)

    def id_of(self, tensor: torch.Tensor | None) -> int:
        """The id of the storage behind `tensor` if the region made it and it is alive; else 0."""
        if tensor is None:
            return 0
        return self.ids.get(tensor.untyped_storage()._cdata, 0)

    def _track(self, storage: torch.UntypedStorage, arg_keys: set[int]) -> None:
        key, nbytes = storage._cdata, storage.nbytes()
        if nbytes == 0 or key in arg_keys or key in self.ids:
            return
        ident = self._next
        self._next += 1
        self.ids[key] = ident
        self.events.append(nbytes)
        self._refs[key] = weakref.ref(storage, partial(self._freed, key))

    def _freed(self, key: int, _ref: weakref.ref) -> None:
        ident = self.ids.pop(key, None)
        if ident is not None:
            self._refs.pop(key, None)
            self.events.append(-ident)


def record_pass(run: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, grad: torch.Tensor | None,
                params: list[torch.nn.Parameter]) -> AllocRecord:
    """x -> run(x) forward, then backward from `grad` (none when `grad` is None or nothing needs
    a gradient), recorded. Leaves x.grad as it found it."""
    had = x.grad
    x.grad = None
    with AllocRecorder() as recorder:
        output = run(x)
        forward = list(recorder.events)
        output_id = recorder.id_of(output)
        if output.requires_grad and (grad is not None or output.numel() == 1):
            torch.autograd.backward(output, grad)
        input_grad = recorder.id_of(x.grad) if x.requires_grad else 0
        backward = recorder.events[len(forward):]  # before the profiler drops the output
        del output
    x.grad = had
    return AllocRecord(forward=forward, backward=backward, output=output_id, input_grad=input_grad,
                       params=[p.untyped_storage().nbytes() for p in params])


def record_loss(loss_fn, output: torch.Tensor, targets: torch.Tensor) -> AllocRecord:
    """The loss's forward on the last layer's output and its backward, recorded: `output`
    stands for the stage's output (its gradient is the input_grad)."""
    leaf = output.detach().requires_grad_(output.is_floating_point())
    return record_pass(lambda x: loss_fn(x, targets), leaf, None, [])


def layer_records(layer: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor | None,
                  options: list[str]) -> dict[str, AllocRecord]:
    """The layer's record under none, full (torch.utils.checkpoint, non-reentrant) and each
    selective option in `options` (planner/runtime/recompute.py's runners), as the runtime runs them."""
    from torch.utils.checkpoint import checkpoint

    from planner.runtime.recompute import layer_runner

    params = list(layer.parameters())
    runners = {OPTION_NONE: layer, OPTION_FULL: partial(checkpoint, layer, use_reentrant=False),
               **{name: layer_runner(layer, name) for name in options}}
    # the runtime allocates every gradient before the step (stagemodule.allocate_grads): a new
    # gradient is added into it and freed, as here
    missing = [p for p in params if p.requires_grad and p.grad is None]
    for param in missing:
        param.grad = torch.zeros_like(param)
    try:
        return {name: record_pass(run, x, grad, params) for name, run in runners.items()}
    finally:
        for param in missing:
            param.grad = None


def with_records(profiles: list[LayerProfile], layers, layer_inputs: list[torch.Tensor],
                 layer_outputs: list[torch.Tensor]) -> list[LayerProfile]:
    """Measured profiles with each layer's records (none, full and the options it lists but
    offload, which the replay derives from none), recorded once per kind: layers of one kind
    are structurally identical."""
    by_kind: dict[str, dict[str, AllocRecord]] = {}
    done = []
    for index, (profile, (_, layer)) in enumerate(zip(profiles, layers, strict=True)):
        if profile.kind not in by_kind:
            x = layer_inputs[index].detach().requires_grad_(index > 0 and layer_inputs[index].is_floating_point())
            output = layer_outputs[index]
            grad = torch.zeros_like(output) if output.is_floating_point() else None
            names = [o.name for o in profile.recompute_options[2:] if o.name != OPTION_OFFLOAD]
            by_kind[profile.kind] = layer_records(layer, x, grad, names)
        done.append(profile.model_copy(update={"alloc_records": by_kind[profile.kind]}))
    return done


def _tensors(tree) -> list[torch.Tensor]:
    return [leaf for leaf in tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


def synthesised(layer: LayerProfile, kept_terms: list[int], *, input_grad_in_transient: bool = False,
                scratch_terms: list[int] | None = None, scratch_freed_early: int = 0,
                last_uses: tuple[int | None, ...] | None = None,
                points: dict[str, tuple[int, str]] | None = None,
                freed_last: frozenset[int] = frozenset()) -> LayerProfile:
    """An analytic layer with none's and full's records made from the tensors its formulas count
    (`kept_terms`, the bytes of each kept tensor; the one equal to its saved input, which the
    previous layer made, left out): none's forward makes each kept tensor and the output; its
    backward makes its scratch (the transient beyond the incoming gradient) and the input's
    gradient, then frees the scratch and the kept tensors, last first. Full's forward makes the
    output alone, its backward the kept tensors again first. One block of all parameters.
    `input_grad_in_transient`: the layer's transient counts the input's gradient (the analytic head's), so its
    scratch is what is left beyond the incoming gradient and that. `scratch_terms`: the scratch's tensors in the
    order the backward makes them (a gated block's three f-wide gradients, analytic_scratch.block_scratch),
    summing to it, the first `scratch_freed_early` freed once the rest are made (before the input's gradient:
    SwiGLU's product gradient after the `mul`'s node); None: as the layer's records already cut it (remade under
    --compile), else one tensor. `last_uses` (analytic_lifetimes.forward_last_uses, one per kept term): the index of
    the term after whose making the block's eager forward frees each (None: alive to its end), from which full's
    record holds its checkpointed forward (`rerun_forward`: torch's checkpoint keeps none of them, so each is
    freed at its last use); None: no lifetimes read, none held. `points` (analytic_lifetimes.forward_points): named
    points of that forward by term, held as indices into it (`rerun_points`); `freed_last`
    (analytic_lifetimes.forward_freed_last): terms freed after the others freed at the same point."""
    keep = list(range(len(kept_terms)))
    if layer.input_in_act_bytes and layer.input_in_act_bytes in kept_terms:
        keep.remove(list(kept_terms).index(layer.input_in_act_bytes))
    keep = [at for at in keep if kept_terms[at] > 0]
    terms = [kept_terms[at] for at in keep]
    grad = 0 if layer.kind == "embedding" else layer.input_bytes  # token ids have no gradient
    scratch = max(0, layer.transient_bytes - layer.output_bytes - (grad if input_grad_in_transient else 0))
    if scratch_terms is None:
        pieces, early = _scratch_pieces(layer, scratch)
    else:
        pieces, early = _given_pieces(layer, scratch, scratch_terms), scratch_freed_early

    def backward(next_id: int, saved: list[int]) -> tuple[list[int], int]:
        """Scratch and the input's gradient from id `next_id`, then the frees; and the gradient's id."""
        codes, frees, grad_id = [], [], 0
        for piece in pieces:
            codes.append(piece)
            frees.insert(0, -next_id)  # freed last first, as the kept tensors
            next_id += 1
        codes += frees[len(frees) - early:] if early else []  # the first ones, freed before the gradient
        frees = frees[:len(frees) - early]
        if grad:
            codes.append(grad)
            grad_id = next_id
        return codes + frees + [-ident for ident in reversed(saved)], grad_id

    kept = len(terms)
    params = [layer.param_bytes] if layer.param_bytes else []
    none_backward, none_grad = backward(kept + 2, list(range(1, kept + 1)))
    full_backward, full_grad = backward(kept + 2, list(range(2, kept + 2)))  # output is id 1, the recompute 2..
    records = {
        OPTION_NONE: AllocRecord(forward=[*terms, layer.output_bytes], backward=none_backward, output=kept + 1,
                                 input_grad=none_grad, params=params),
        OPTION_FULL: AllocRecord(forward=[layer.output_bytes], backward=[*terms, *full_backward], output=1,
                                 input_grad=full_grad, params=params,
                                 **_checkpointed_forward(kept_terms, keep, last_uses, points, freed_last)),
    }
    return layer.model_copy(update={"alloc_records": records})


def _checkpointed_forward(kept_terms, keep: list[int], last_uses, points=None, freed_last=frozenset()) -> dict:
    """The kept terms `keep` (indices into kept_terms) made in order, each freed once the term its last use names
    (last_uses, by index into kept_terms) is made, in their order, those of `freed_last` after the rest
    (`rerun_forward`; [] without last_uses), and `points` (by term:
    before its making, right after it, after the frees that follow) as indices into those codes (`rerun_points`)."""
    if last_uses is None or len(last_uses) != len(kept_terms):
        return {"rerun_forward": []}
    ids = {at: n for n, at in enumerate(keep, 1)}
    codes: list[int] = []
    marks: dict[tuple[int, str], int] = {}
    for at in range(len(kept_terms)):
        marks[at, "before"] = len(codes)
        if at in ids:
            codes.append(kept_terms[at])
        marks[at, "made"] = len(codes)
        dying = [dead for dead in keep if last_uses[dead] == at]
        codes += [-ids[dead] for dead in sorted(dying, key=lambda dead: dead in freed_last)]
        marks[at, "after"] = len(codes)
    return {"rerun_forward": codes, "rerun_points": {name: marks[mark] for name, mark in (points or {}).items()}}


def _scratch_pieces(layer: LayerProfile, scratch: int) -> tuple[list[int], int]:
    """The scratch's tensors as none's record made them (its backward's allocations before the input's gradient),
    and how many of them it freed before that gradient, where they sum to `scratch`; else one tensor."""
    if not scratch:
        return [], 0
    record = layer.alloc_records.get(OPTION_NONE)
    if record is None:
        return [scratch], 0
    made = sum(1 for code in record.forward if code > 0)
    terms, early, grad_at = [], 0, None
    for code in record.backward:
        if code > 0:
            made += 1
            if made == record.input_grad:
                grad_at = made
                break
            terms.append(code)
        elif terms:
            early += 1
    if grad_at is None and record.input_grad:
        terms, early = [], 0
    if sum(terms) != scratch or not all(size > 0 for size in terms):
        return [scratch], 0
    return terms, early


def _given_pieces(layer: LayerProfile, scratch: int, terms: list[int]) -> list[int]:
    """`terms` less zeros; they must sum to the scratch."""
    if not scratch:
        return []
    terms = [size for size in terms if size > 0]
    assert sum(terms) == scratch, (layer.name, terms, scratch)
    return terms


def kept_then_rerun(none: AllocRecord, kept: list[int], rerun_bytes: int) -> AllocRecord:
    """An option that keeps `kept` (its tensors but the input, in order) and reruns the rest of the forward at
    once: its forward makes `kept`, then none's output; its backward makes the rerun (one request of `rerun_bytes`,
    freed once made: the rerun's tensors die as the backward uses them), then none's backward, then frees `kept`,
    last first (analytic op-level SAC, analytic_records; a compiled layer's options, compiled_kept)."""
    base = remade(none, set(range(len(forward_sizes(none)))), [[rerun_bytes]] if rerun_bytes else [])
    shift = len(kept)
    backward = [code if code > 0 else code - shift for code in base.backward]
    backward += [-ident for ident in range(shift, 0, -1)]
    return AllocRecord(forward=[*kept, *base.forward], backward=backward,
                       output=base.output + shift if base.output else 0,
                       input_grad=base.input_grad + shift if base.input_grad else 0, params=none.params)


def forward_sizes(none: AllocRecord) -> list[int]:
    """A synthesised none record's kept tensors in its forward (every allocation but the output), in order."""
    made = [code for code in none.forward if code > 0]
    return [size for ident, size in enumerate(made, 1) if ident != none.output]


def remade(none: AllocRecord, removed: set[int], reruns: list[list[int]]) -> AllocRecord:
    """A synthesised none record with the kept tensors at `removed` (indices into forward_sizes) not made by the
    forward, and each group of `reruns` made then freed at the backward's start, before none's backward."""
    made = [code for code in none.forward if code > 0]
    new_id: dict[int, int] = {}
    forward: list[int] = []
    kept_index = 0
    for ident, size in enumerate(made, 1):
        if ident != none.output:
            if kept_index in removed:
                kept_index += 1
                continue
            kept_index += 1
        forward.append(size)
        new_id[ident] = len(forward)
    next_id = len(forward) + 1
    backward: list[int] = []
    for sizes in reruns:
        first = next_id
        backward += sizes
        next_id += len(sizes)
        backward += [-ident for ident in reversed(range(first, next_id))]
    old_next = len(made) + 1
    for code in none.backward:
        if code > 0:
            new_id[old_next] = next_id
            old_next += 1
            next_id += 1
            backward.append(code)
        elif -code in new_id:
            backward.append(-new_id[-code])
    return AllocRecord(forward=forward, backward=backward, output=new_id.get(none.output, 0),
                       input_grad=new_id.get(none.input_grad, 0), params=none.params)
