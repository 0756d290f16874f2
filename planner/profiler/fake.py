"""Profiles of real model code at full size, without its hardware (`ckplan profile --fake`).

The model is built on the `meta` device (no memory, no initialisation work), its
parameters and buffers become fake tensors, and the real forward and backward run
under `torch._subclasses.fake_tensor.FakeTensorMode`: every op computes shapes, dtypes
and storages, none computes values. From that run, with the measured profiler's own
code (measure.py, saved.py):

- kept bytes per layer: the saved-tensor hooks (saved.py), storage by storage;
- transients: the storage tracker over each layer's forward and backward;
- parameters and tied sets: exact, from the built modules;
- FLOPs per pass: `torch.utils.flop_counter.FlopCounterMode` (matmuls, convolutions,
  attention kernels), and the bytes every other op reads and writes (`OpBytes`);
- each layer's recompute options (planner/runtime/recompute.py): kept bytes by the same hooks, the
  work each adds to forward + backward by the same counters, its transient by the tracker.

Time has no measurement here; it is a roofline per pass (planner/profiler/roofline.py, the
analytic profile's time model too): each matmul torch dispatches at the fraction of the GPU's
peak published for a matmul of its size, each attention kernel at its published throughput
(a causal one running half its blocks), plus the memory-bound ops' bytes over the HBM
bandwidth. What that leaves out (kernel launches, communication, the pipeline's bubble) the
cost model's other terms and `ckplan calibrate` carry.

A layer equal to an earlier one in everything its fake run can see (planner/profiler/fake_same.py:
its modules' classes and plain attributes, its tensors' metadata, its input and output) is not run
again: it carries that layer's figures under its own name (32 decoder blocks of one kind run once).

The fake mode itself (the model's parameters, buffers and batch as fake tensors, and the sentence
for code that needs values) is planner/profiler/fake_mode.py.

Kernels run as torch's CPU kernels under the fake mode, also for a profile made for a
GPU (this machine's torch has no CUDA): their saved tensors are CPU's. For attention
that is the same set (torch's CPU flash attention keeps the output and the log-sum-exp,
as CUDA's does; with dropout, planner/profiler/device_attention.py keeps it so).
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from planner.cost.tied import tied_params
from planner.models.archs import GPU
from planner.profiler import (
    allocseq,
    analytic,
    analytic_tied,
    fake_moe,
    fake_same,
    fake_wgrad,
    float8,
    measure,
    options,
    roofline,
)
from planner.profiler.fake_mode import data_free, fake_module, fake_tensor, new_mode
from planner.profiler.fake_split import with_split_times
from planner.profiler.kinds import buffer_bytes, input_grads, layer_kinds, lookup_param_count
from planner.profiler.opclass import Tracker, op_class
from planner.profiler.roofline import Kernel, Work
from planner.profiler.saved import Layers, LossFn, saved_bytes
from planner.profiler.splitbackward import split_per_option
from planner.profiler.storages import StorageTracker, counted_bytes, storage_nbytes
from planner.profiler.transients import forward_only_bytes
from planner.profiler.userfault import blame
from planner.runtime.recompute import find_options, layer_runner
from planner.runtime.routing import Routing
from planner.schema import (
    OPTION_FULL,
    OPTION_NONE,
    OPTION_OFFLOAD,
    LayerProfile,
    RecomputeOption,
    TiedSet,
)

# what `ckplan profile --fake` and the scripts call here, the fake mode's entry points (fake_mode.py) among them
__all__ = ["OpBytes", "counting", "data_free", "fake_measure", "fake_module", "fake_tensor", "new_mode", "roofline_ms"]

FP32 = 4


# ---------------------------------------------------------------- work per pass


def _heads_matched(query, key, value):
    """Key and value shapes at the query's head count (grouped-query attention shares K/V heads)."""
    heads = query[1]
    return (*key[:1], heads, *key[2:]), (*value[:1], heads, *value[2:])


def _cpu_flash_flops(query, key, value, *args, out_val=None, **kwargs) -> int:
    key, value = _heads_matched(query, key, value)
    return sdpa_flop_count(query, key, value)


def _cpu_flash_backward_flops(grad_out, query, key, value, *args, out_val=None, **kwargs) -> int:
    key, value = _heads_matched(query, key, value)
    return sdpa_backward_flop_count(grad_out, query, key, value)


# torch's FLOP counter knows the CUDA attention kernels; a fake run takes the CPU one, whose
# work is the same matmuls (torch's own formulas: full s x s scores, backward 2.5x forward); and
# it knows no grouped matmul, which transformers' mixtures of experts run (fake_moe.py)
CUSTOM_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_backward_flops,
    torch.ops.aten._grouped_mm: fake_moe.grouped_mm_flops,
}


# what OpBytes records as one kernel each: attention kernels (at the attention kernels' rate), and
# every other op torch's counter counts (matmuls, convolutions) as a matmul of its FLOPs
ATTENTION_OPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: "attention-fwd",
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: "attention-bwd",
    torch.ops.aten._scaled_dot_product_flash_attention: "attention-fwd",
    torch.ops.aten._scaled_dot_product_flash_attention_backward: "attention-bwd",
    torch.ops.aten._scaled_dot_product_efficient_attention: "attention-fwd",
    torch.ops.aten._scaled_dot_product_efficient_attention_backward: "attention-bwd",
    torch.ops.aten._scaled_dot_product_cudnn_attention: "attention-fwd",
    torch.ops.aten._scaled_dot_product_cudnn_attention_backward: "attention-bwd",
}
# ops whose output is a view in all but name (their schemas declare no alias), and allocations that write
# nothing (empty's family: uninitialised memory, aten/src/ATen/native/TensorFactories.cpp; transformers'
# DeepseekV3Attention.expand_kv fills a new_empty key by slices, autograd's CopySlices backward a
# new_empty_strided gradient): they move nothing
NO_TRAFFIC = {torch.ops.aten._unsafe_view, torch.ops.aten.empty, torch.ops.aten.empty_like, torch.ops.aten.empty_strided,
              torch.ops.aten.new_empty, torch.ops.aten.new_empty_strided}
FLOAT8 = {getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
          if hasattr(torch, name)}


class OpBytes(TorchDispatchMode):
    """The kernels FlopCounterMode counts, each with its FLOPs (roofline.Kernel), and the bytes
    read and written by every other op (elementwise ops, norms, softmax, copies): what makes a
    pass memory-bound. An op whose output is a view of its input moves nothing and is skipped;
    an embedding lookup reads the rows it gathers, not its whole table. With a `tracker`
    (torch's ModuleTracker, forward and backward) each op's bytes are also classed by the
    innermost module running it (op_class; `.grad` accumulation: elementwise); `fixed_class`
    classes every op alike (the loss)."""

    def __init__(self, tracker: Tracker | None = None, fixed_class: str | None = None) -> None:
        super().__init__()
        self.bytes = 0
        self.kernels: list[Kernel] = []
        self.classed: Counter = Counter()
        self._tracker, self._fixed = tracker, fixed_class
        self._types: dict[str, str] = {}
        self._registry = FlopCounterMode(custom_mapping=CUSTOM_FLOPS).flop_registry

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        made = _tensors(out)  # no tensor out (prim.device, sizes): a question about metadata, no traffic
        packet = func.overloadpacket
        if packet in self._registry:
            kernel = _kernel(func, self._registry[packet](*args, **kwargs, out_val=out), args, kwargs)
            grouped = packet is torch.ops.aten._grouped_mm  # one matmul per expert (fake_moe.grouped_kernels)
            self.kernels.extend(fake_moe.grouped_kernels(kernel, args, kwargs) if grouped else [kernel])
        elif made and packet not in NO_TRAFFIC and not _aliases(func):
            moved = _moved_bytes(packet, args, kwargs, made)
            self.bytes += moved
            found = self._class()
            if found is not None:
                self.classed[found] += moved
        return out

    def _class(self) -> str | None:
        if self._fixed is not None or self._tracker is None:
            return self._fixed
        node = torch._C._current_autograd_node()
        if (node is None and torch._C._current_graph_task_id() != -1) or (node is not None and "AccumulateGrad" in node.name()):
            return "elementwise"  # autograd's own sums where a tensor fans out; .grad accumulation
        innermost = self._tracker.innermost()
        if innermost not in self._types:  # ModuleTracker names modules by their class and attribute path
            self._types = {name: type(module).__name__ for module, name in self._tracker._known_modules.items()}
        return op_class(self._types.get(innermost, ""))


def _moved_bytes(packet, args, kwargs, made: list[torch.Tensor]) -> int:
    """Every input and output, but for gathers and scatters, which touch only the entries
    their indices name: an embedding reads the rows it gathers (and writes them), nll_loss the
    targets' log-probabilities, and nll_loss's backward writes its zero-filled gradient and
    scatters into the targets' entries."""
    if packet is torch.ops.aten.embedding:
        return 2 * sum(map(_nbytes, made)) + _nbytes(args[1])
    if packet is torch.ops.aten.nll_loss_forward:
        return args[1].numel() * args[0].element_size() + _nbytes(args[1]) + sum(map(_nbytes, made))
    if packet is torch.ops.aten.nll_loss_backward:
        return sum(map(_nbytes, made)) + _nbytes(args[2]) * 2
    return sum(_nbytes(t) for t in (*_tensors((args, kwargs)), *made))


def _kernel(func, flops: int, args, kwargs) -> Kernel:
    """A counted op as a kernel: an attention kernel skips the masked half of a causal mask's
    blocks and runs at its rate for the query's length; a matmul with float8 inputs runs at the FP8
    peak."""
    kind = ATTENTION_OPS.get(func.overloadpacket)
    if kind is not None:
        names = [argument.name for argument in func._schema.arguments]
        given = dict(zip(names, args)) | kwargs
        return Kernel(kind, int(flops), 0.5 if given.get("is_causal") else 1.0, given["query"].shape[-2])
    fp8 = any(tensor.dtype in FLOAT8 for tensor in _tensors(args))
    return Kernel("matmul-fp8" if fp8 else "matmul", int(flops))


def _aliases(func) -> bool:
    return any(ret.alias_info is not None and not ret.alias_info.is_write for ret in func._schema.returns)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _tensors(tree) -> list[torch.Tensor]:
    return [leaf for leaf in tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


@contextmanager
def counting(fixed_class: str | None = None):
    """Yields a callable returning the Work done inside the region so far, its bytes classed by the
    module running each op (OpBytes), or all as `fixed_class`."""
    with FlopCounterMode(display=False, custom_mapping=CUSTOM_FLOPS) as flops, Tracker() as tracker, \
            OpBytes(tracker, fixed_class) as moved:
        yield lambda: roofline.work(int(flops.get_total_flops()), moved.bytes, moved.kernels,
                                    classed=dict(moved.classed))


def roofline_ms(work: Work, gpu: GPU) -> float:
    """The pass's kernels at their shape-dependent rates plus its memory-bound bytes at the HBM
    bandwidth, in ms (planner/profiler/roofline.py, the analytic profile's time model too)."""
    return roofline.roofline_ms(work, gpu)


def _layer_work(layer: nn.Module, x: torch.Tensor, grad: torch.Tensor | None) -> tuple[Work, Work, Work]:
    """(forward, backward, what checkpointing adds) of one layer on its input."""
    with counting() as done:
        out = layer(x)
        fwd = done()
        ran = measure._backward(out, grad)
        bwd = done() - fwd
    del out
    if not ran:
        return fwd, bwd, Work(0, 0)
    return fwd, bwd, _added_work(partial(checkpoint, layer, use_reentrant=False), x, grad, fwd + bwd)


def _added_work(run, x: torch.Tensor, grad: torch.Tensor | None, plain: Work) -> Work:
    """What running x -> run(x) forward and backward adds to the plain layer's `plain` work."""
    with counting() as done:
        out = run(x)
        measure._backward(out, grad)
        whole = done()
    del out
    return whole - plain


@dataclass
class _LayerRun:
    """One layer's plain work and its selective options' transients and added work."""

    fwd: Work
    bwd: Work
    recompute: Work
    transient: int
    has_backward: bool
    option_transients: dict[str, int]
    option_work: dict[str, Work]
    routing: Routing | None = None  # a mixture-of-experts layer's experts and balanced routing (fake_moe.py)
    expert_transient: int = 0  # of transient, the routed experts' weight gradients'
    weight_grad_transient: int = 0  # of transient, autograd's fresh weight gradients' (fake_wgrad.py)
    incoming: int = 0  # of transient, the gradient of the output (transients._transient_parts)
    forward: int | None = None  # of transient, the forward's own (fake_wgrad.transient_parts)
    split: dict[str, tuple[int, int, int, int, int, int]] | None = None  # option: splitbackward.split_backward_bytes


def _run_options(layer: nn.Module, x: torch.Tensor, grad: torch.Tensor | None, plain: Work,
                 has_backward: bool) -> tuple[dict[str, int], dict[str, Work]]:
    """The transient and the added work of each option the layer runs (none where nothing runs backward)."""
    if not has_backward:
        return {}, {}

    def transient(run) -> int:
        x.grad = None  # allocated by the backward, as in the plain layer's measurement
        return measure._transient_bytes(run, x, grad, tracker=lambda device: StorageTracker())

    # offload's copies are device-to-host transfers that no fake device runs: it is derived
    # from the saved bytes instead (_offload_option)
    names = [name for name in find_options(layer) if name != OPTION_OFFLOAD]
    transients, _ = options.option_transients(layer, names, transient)
    return transients, {name: _added_work(layer_runner(layer, name), x, grad, plain) for name in transients}


# ---------------------------------------------------------------- the measurement


def fake_measure(layers: Layers, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: LossFn, *,
                 layer_outputs: list[torch.Tensor], gpu: GPU, device_type: str = "cuda",
                 on_layer: Callable[[str], None] = lambda name: None,
                 once: bool = True) -> tuple[measure.Measurement, dict]:
    """measure.measure_model's Measurement, from one fake run (no timing: rooflines), and
    the FLOPs per layer and pass (forward, backward, recompute) it rests on. `once`: a layer whose
    signature (fake_same.py) an earlier layer has carries that layer's figures under its own name,
    unrun (False: every layer runs). The whole-model pass of kept bytes runs every layer: what a
    layer is charged depends on what the layers before it saved (saved.py)."""
    layer_inputs = [inputs, *layer_outputs[:-1]]
    with blame("the layers' forward"), data_free("a layer's forward", layers):
        needs_grad = input_grads(layers, layer_inputs)  # as measured profiles record it (LayerProfile.input_requires_grad)
    kinds = layer_kinds(layers, needs_grad)
    runs, records = [], []  # records: each layer's allocations and frees per option (allocseq)
    linears = []  # each layer's nn.Linear calls (Float8's record, planner/profiler/float8.py)
    # the layer each one's figures come from: itself, or the first of its signature (fake_same.py)
    sources, first_of, shared = [], {}, fake_same.shared_parameters([layer for _, layer in layers])
    for index, (name, layer) in enumerate(layers):
        x = layer_inputs[index].detach().requires_grad_(needs_grad[index] and layer_inputs[index].is_floating_point())
        output = layer_outputs[index]
        key = fake_same.signature(layer, x, output, shared) if once else None
        if key is not None and key in first_of:  # a layer like one measured: its figures, its own name
            source = first_of[key]
            sources.append(source)
            runs.append(copy.deepcopy(runs[source]))
            records.append(copy.deepcopy(records[source]))
            linears.append(fake_same.renamed(linears[source], layers[source][0], name))
            continue
        if key is not None:
            first_of[key] = index
        sources.append(index)
        grad = torch.zeros_like(output) if output.is_floating_point() else None
        for param in layer.parameters():
            if param.requires_grad and param.grad is None:
                param.grad = torch.zeros_like(param)
        trains = x.requires_grad or any(p.requires_grad for p in layer.parameters())
        has_backward = grad is not None and trains
        with blame(f"layer {name!r}"), data_free(f"layer {name!r}"):
            # measure._transient_bytes's count, the same with the fresh weight gradients left out, and how much of
            # it is the incoming gradient, in one run; a layer running no backward: its forward's peak (§730)
            if trains:
                transient, in_place, incoming, forward = fake_wgrad.transient_parts(layer, x, grad)
            else:
                transient = in_place = forward = forward_only_bytes(layer, x, tracker=lambda device: StorageTracker())
                incoming = 0
            fwd, bwd, recompute = _layer_work(layer, x, grad)
            linears.append(float8.module_linears(layer, x, name) if has_backward else [])
            runs.append(_LayerRun(fwd, bwd, recompute, transient, has_backward,
                                  *_run_options(layer, x, grad, fwd + bwd, has_backward),
                                  fake_moe.fake_routing(layer, x),
                                  fake_moe.expert_transient_bytes(layer, x, grad, transient),
                                  transient - in_place, incoming, forward=forward))
            records.append(allocseq.layer_records(layer, x, grad, list(runs[-1].option_transients)))
            # the split backward's bytes, by the measured profiler's own function on the fake tensors (§886)
            runs[-1].split = split_per_option(layer, x, grad, [OPTION_NONE, OPTION_FULL, *runs[-1].option_transients],
                                              tracker=lambda device: StorageTracker())
        layer.zero_grad(set_to_none=True)
    linear_calls = [float8.converted(calls) for calls in linears]
    chosen = options.common_per_kind(kinds, [list(run.option_transients) for run in runs])
    with blame("the model under FakeTensorMode"), data_free("the model's forward or backward"):
        saved = saved_bytes(layers, inputs, targets, loss_fn, options=chosen)
    chosen = options.saving_per_kind(kinds, chosen, saved.act_bytes, saved.option_bytes)
    profiles, flops = [], {}
    split_works: dict[int, dict] = {}  # per measured layer, its split backward's work by option (fake_split.py)
    for index, ((name, layer), run) in enumerate(zip(layers, runs, strict=True)):
        x, output = layer_inputs[index], layer_outputs[index]
        fwd, bwd, recompute, transient = run.fwd, run.bwd, run.recompute, run.transient
        params = list(layer.parameters())
        count, trained = sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)
        flops[name] = {"forward": fwd.flops, "backward": bwd.flops, "recompute": recompute.flops,
                       **{f"recompute {option}": run.option_work[option].flops for option in chosen[index]}}
        fwd_ms, bwd_ms = roofline_ms(fwd, gpu), roofline_ms(bwd, gpu)
        full_ms = roofline_ms(recompute, gpu) if run.has_backward else None
        act, input_bytes = saved.act_bytes[index], storage_nbytes(x)
        split = partial(options.split_byte_fields, run.split)
        profiles.append(with_split_times(LayerProfile(  # and the split backward's passes
            name=name, kind=kinds[index], fwd_ms=fwd_ms, bwd_ms=bwd_ms, fwd_ms_min=fwd_ms, fwd_ms_max=fwd_ms,
            bwd_ms_min=bwd_ms, bwd_ms_max=bwd_ms,
            recompute_ms=full_ms, act_bytes=act, input_bytes=input_bytes, output_bytes=storage_nbytes(output),
            input_in_act_bytes=saved.input_in_act_bytes[index], input_shared_bytes=saved.input_shared_bytes[index],
            param_count=count,
            param_bytes=sum(p.numel() * p.element_size() for p in params),
            largest_param_count=max((p.numel() for p in params), default=0),
            last_trained_param_count=next((p.numel() for p in reversed(params) if p.requires_grad), 0),
            transient_bytes=transient,
            trained_param_count=trained, param_tensors=sum(p.requires_grad for p in params),
            trained_param_numels=[p.numel() for p in params if p.requires_grad],
            input_requires_grad=needs_grad[index],
            weight_grad_transient_bytes=run.weight_grad_transient,
            incoming_grad_bytes=run.incoming,
            forward_transient_bytes=run.forward,
            lookup_param_count=lookup_param_count(layer), buffer_bytes=buffer_bytes(layer),
            step_ms=analytic.step_ms(trained, gpu), **_routing_fields(run),
            recompute_options=[
                RecomputeOption(name=OPTION_NONE, kept_bytes=act, **split(OPTION_NONE)),
                RecomputeOption(name=OPTION_FULL, kept_bytes=input_bytes, recompute_ms=fwd_ms if full_ms is None
                                else full_ms, recompute_peak_bytes=max(act - input_bytes, 0), **split(OPTION_FULL)),
                *(RecomputeOption(name=option, kept_bytes=saved.option_bytes[index][option],
                                  recompute_ms=roofline_ms(run.option_work[option], gpu),
                                  recompute_peak_bytes=max(run.option_transients[option] - transient, 0),
                                  **split(option))
                  for option in chosen[index]),
                *_offload_option(act, saved.input_in_act_bytes[index], device_type, gpu, run.has_backward,
                                 fwd_ms=fwd_ms, bwd_ms=bwd_ms, first_bytes=saved.last_saved_bytes[index],
                                 split=split(OPTION_NONE))],
            alloc_records={name: record for name, record in records[index].items()
                           if name in (OPTION_NONE, OPTION_FULL, *chosen[index])},
            float8=float8.record(linear_calls[index], gpu, fwd, bwd,
                                 {OPTION_FULL: recompute, **{option: run.option_work[option] for option in chosen[index]}}),
        ), layer, x if needs_grad[index] else None, output, gpu=gpu, counting=counting,  # no input gradient
            works=split_works.setdefault(sources[index], {})))
        on_layer(name)
    with blame("loss_fn(output, target)"), data_free("loss_fn(output, target)"):
        loss_transient = measure._loss_transient_bytes(loss_fn, layer_outputs[-1], targets,
                                                       tracker=lambda device: StorageTracker())
        loss_work = _loss_work(loss_fn, layer_outputs[-1], targets)
        loss_alloc = allocseq.record_loss(loss_fn, layer_outputs[-1], targets)
        with torch.no_grad():
            value = loss_fn(layer_outputs[-1], targets)
            loss_value_bytes = counted_bytes(value.numel() * value.element_size(), value.device)
    tied = [TiedSet(layers=item.layers, param_count=item.param_count, param_bytes=item.param_bytes,
                    sum_ms=analytic_tied.tied_sum_ms(item.param_bytes, gpu))
            for item in tied_params(layers)]
    flops["loss"] = {"forward": loss_work.flops}
    return measure.Measurement(profiles, storage_nbytes(inputs), saved.loss_bytes + loss_value_bytes,
                               roofline_ms(loss_work, gpu), loss_transient, storage_nbytes(targets), [], tied,
                               loss_alloc), flops


def _routing_fields(run: _LayerRun) -> dict:
    """A MoE layer's record as the measured profile's (routing.Routing), routing charged balanced."""
    if run.routing is None:
        return {}
    return {"expert_param_count": run.routing.expert_param_count, "a2a_bytes": run.routing.a2a_bytes,
            "routed_tokens": run.routing.routed_tokens, "expert_act_bytes": run.routing.expert_act_bytes,
            "expert_transient_bytes": run.expert_transient}


def _offload_option(act_bytes: int, input_in_act_bytes: int, device_type: str, gpu: GPU,
                    has_backward: bool, *, fwd_ms: float, bwd_ms: float, first_bytes: int,
                    split: dict[str, int]) -> list[RecomputeOption]:
    """A layer's offload option (recompute.offloaded_activations) from its saved bytes: it keeps
    on the device what of its input it saves and copies the rest out and back, timed over the
    GPU's host link as the analytic profile times it. None on cpu (the host is the device).
    `split`: none's split backward bytes, which offload's bound (no fake device runs its copies):
    the copies come back at the start of the input pass and the weight pass's nodes hold them
    until it runs (§887), so its held bytes and input pass's peak are none's and the moved bytes."""
    moved = act_bytes - input_in_act_bytes
    if device_type == "cpu" or not has_backward or moved <= 0:
        return []
    option = analytic.offload_option(input_in_act_bytes, moved, gpu, fwd_ms=fwd_ms, bwd_ms=bwd_ms,
                                     first_bytes=min(first_bytes, moved))
    if split["split_peak_bytes"] <= 0:  # nothing to split off (no weight, or no input gradient)
        return [option]
    return [option.model_copy(update={**split, "split_held_bytes": split["split_held_bytes"] + moved,
                                      "split_input_peak_bytes": split["split_input_peak_bytes"] + moved})]


def _loss_work(loss_fn: LossFn, output: torch.Tensor, targets: torch.Tensor) -> Work:
    leaf = output.detach().requires_grad_(output.is_floating_point())
    with counting("loss") as done:
        value = loss_fn(leaf, targets)
        if value.requires_grad:
            value.backward()
        return done()
