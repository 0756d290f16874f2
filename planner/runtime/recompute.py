"""Recompute options: what each one is, which a layer has, and how a layer runs under one.

A layer's option decides what it keeps for its backward and what the backward recomputes.
"none" keeps everything, "full" keeps the layer's input and reruns its forward
(torch.utils.checkpoint). The selective ones recompute parts of the layer, the way
Megatron-LM's `--recompute-modules` and torchtitan's selective activation checkpointing do:

    attn          the attention submodule(s) under checkpoint, whole (projections, rotary, the
                  kernel): their inner activations are recomputed, their inputs kept. Not
                  Megatron-LM's core_attn: that is `core-attn` (the kernel alone, Q, K and V
                  kept), which analytic profiles offer and this runtime does not (a Hugging Face
                  model's core attention is a function call, not a module to checkpoint)
    mlp           the MLP submodule under checkpoint
    mlp-act       the MLP under selective checkpoint that saves every matmul output and
                  recomputes the rest: SwiGLU keeps w1(x) and w3(x), recomputes silu(g) * u
                  (Megatron's and torchtitan's "activation only" recompute)
    norm          every norm submodule (LayerNorm, RMSNorm) under checkpoint
    save-matmuls  the whole layer under selective checkpoint saving matmul and attention
                  outputs, recomputing every other op (torchtitan's op-level SAC)
    offload       nothing recomputed: the layer keeps its input on the device and copies every
                  other tensor it saves to host memory in forward, back in backward
                  (offloaded_activations; Megatron-LM's activation offloading)

and combinations of attn, mlp / mlp-act and norm, comma-joined ("attn,mlp-act"), where each
part is in the layer and the combination checkpoints more than any of its parts.

Everything runs on torch's own pieces: `checkpoint(use_reentrant=False)`,
`create_selective_checkpoint_contexts` and `saved_tensors_hooks`. A module-level option checkpoints its submodules
for one forward of the layer by giving each an instance `forward` that calls its own under
checkpoint, removed when the layer's forward returns; the backward recomputes through the
function checkpoint captured. Checkpoint stashes the RNG state each region starts with and
restores it to recompute, so dropout draws the same masks, whatever the stage's seeding.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten
from torch.utils.checkpoint import (
    CheckpointPolicy,
    SelectiveCheckpointContext,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from planner.schema import OPTION_FULL, OPTION_NONE, OPTION_OFFLOAD

ATTN, MLP, MLP_ACT, NORM, SAVE_MATMULS = "attn", "mlp", "mlp-act", "norm", "save-matmuls"

# Combinations offered where every part is in the layer, in this order. Table order matters:
# the profile lists them so. attn + mlp + norm is left out: it keeps four tensors of the
# layer's width to recompute almost all of it, what full does keeping one.
COMBINATIONS = ((ATTN, MLP), (ATTN, MLP_ACT), (ATTN, NORM), (MLP_ACT, NORM), (ATTN, MLP_ACT, NORM))

# What identifies a layer's parts: a class name containing the word (case-insensitive), or
# the attribute name Megatron-LM, torchtitan, Hugging Face and timm give them (a mixture of
# experts is the MLP of its block: Mixtral's SparseMoeBlock, Qwen2-MoE's, DeepSeek's MoE).
ATTENTION_CLASS_WORDS, ATTENTION_NAMES = ("attention",), ("attn", "self_attn", "attention")
MLP_CLASS_WORDS, MLP_NAMES = ("mlp", "feedforward", "moe"), ("mlp", "feed_forward", "ffn", "moe", "block_sparse_moe")

# The ops whose outputs selective checkpointing saves. At the dispatcher, below autograd, a
# Linear is t + mm / addmm (bmm batched); linear and matmul are listed for kernels that keep
# them whole. Attention kernels (save-matmuls only) return the output and the log-sum-exp
# their backward reads: torchtitan's _save_list (torchtitan/distributed/activation_checkpoint.py).
_aten = torch.ops.aten
MATMUL_OPS = frozenset({_aten.mm, _aten.addmm, _aten.bmm, _aten.baddbmm, _aten.linear, _aten.matmul,
                        _aten._scaled_mm})
ATTENTION_OPS = frozenset({
    _aten._scaled_dot_product_flash_attention, _aten._scaled_dot_product_flash_attention_for_cpu,
    _aten._scaled_dot_product_efficient_attention, _aten._scaled_dot_product_cudnn_attention,
    _aten._flash_attention_forward, _aten._efficient_attention_forward,
})

Observer = Callable[[torch.Tensor], None]  # told each tensor a selective policy saves (the profiler counts them)


# ---------------------------------------------------------------- a layer's parts


def _is_attention(name: str, module: nn.Module) -> bool:
    cls = type(module).__name__.lower()
    return any(word in cls for word in ATTENTION_CLASS_WORDS) or name in ATTENTION_NAMES


def _is_mlp(name: str, module: nn.Module) -> bool:
    """An MLP by its attribute name or class word, never a norm, an attention or a module holding one: a
    mixture-of-experts family names every class after itself (Qwen2MoeRMSNorm, Qwen2MoeAttention,
    Qwen3MoeDecoderLayer), so "moe" in a class name alone does not make an MLP; a decoder layer wrapped
    whole (the Hugging Face adapter's Decoder.layer) holds its attention."""
    if _is_norm(module) or _is_attention(name, module):
        return False
    if any(_is_attention(sub_name.rsplit(".", 1)[-1], sub) for sub_name, sub in module.named_modules() if sub_name):
        return False
    cls = type(module).__name__.lower()
    return any(word in cls for word in MLP_CLASS_WORDS) or name in MLP_NAMES


def _is_norm(module: nn.Module) -> bool:
    """LayerNorm, RMSNorm, GroupNorm by type or by a class name containing "Norm"; never a batch
    norm, whose running statistics a recompute would update twice."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm) or "batchnorm" in type(module).__name__.lower():
        return False
    return isinstance(module, nn.LayerNorm | nn.RMSNorm | nn.GroupNorm) or "Norm" in type(module).__name__


def _outermost(layer: nn.Module, match: Callable[[str, nn.Module], bool]) -> list[nn.Module]:
    """The submodules of `layer` (never itself) that `match` picks, not looking inside a pick."""
    found = []
    for name, child in layer.named_children():
        if match(name, child):
            found.append(child)
        else:
            found += _outermost(child, match)
    return found


def find_parts(layer: nn.Module) -> dict[str, list[nn.Module]]:
    """The submodules each module-level option checkpoints: attention, MLP, norms."""
    mlps = _outermost(layer, _is_mlp)
    return {ATTN: _outermost(layer, _is_attention), MLP: mlps, MLP_ACT: mlps,
            NORM: _outermost(layer, lambda name, module: _is_norm(module))}


def _targets(parts: dict[str, list[nn.Module]], names: tuple[str, ...]) -> list[nn.Module]:
    """The modules a combination checkpoints: its parts' modules, none inside another (a norm
    inside a checkpointed attention is recomputed with it)."""
    chosen = [module for name in names for module in parts[name]]
    inside = {id(sub) for module in chosen for sub in module.modules() if sub is not module}
    return [module for module in dict.fromkeys(chosen) if id(module) not in inside]


def find_options(layer: nn.Module) -> list[str]:
    """The options `layer` supports besides none and full (which it always has): the
    module-level ones whose parts it has, save-matmuls, offload, then the combinations that
    checkpoint more than each of their parts. A layer with no parts found has save-matmuls and
    offload."""
    parts = find_parts(layer)
    found = [name for name in (ATTN, MLP, MLP_ACT, NORM) if parts[name]]
    found.append(SAVE_MATMULS)
    found.append(OPTION_OFFLOAD)
    for combination in COMBINATIONS:
        if not all(parts[name] for name in combination):
            continue
        modules = {id(module) for module in _targets(parts, combination)}
        if all(modules != {id(module) for module in _targets(parts, (name,))} for name in combination):
            found.append(",".join(combination))
    return found


def option_error(layer_name: str, layer: nn.Module, option: str) -> str | None:
    """Why `layer` cannot run `option`, as one sentence; None when it can."""
    known = [OPTION_NONE, OPTION_FULL, *find_options(layer)]
    if option in known:
        return None
    return f"layer {layer_name} has no recompute option {option!r}; its options are {', '.join(known)}"


# ---------------------------------------------------------------- running a layer


# torch 2.13 calls a selective policy after the op, with its output (ctx.op_output); earlier
# versions (2.11, the CUDA build the GPU check ran on) call it before, with no output to see.
_POLICY_SEES_OUTPUT = "op_output" in inspect.signature(SelectiveCheckpointContext.__init__).parameters


def _policy(save: frozenset, observe: Observer | None, ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """Save the outputs of the ops in `save`, recompute every other op."""
    if op.overloadpacket in save:
        if observe is not None and not ctx.is_recompute:
            for tensor in tree_leaves(ctx.op_output):
                if isinstance(tensor, torch.Tensor):
                    observe(tensor)
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


class _ObserveSaved:
    """The forward's dispatch mode, and once the forward is done, observe() told every tensor
    the policy saved, read from the mode's storage (for a torch whose policy sees no output)."""

    def __init__(self, mode, observe: Observer):
        self.mode, self.observe = mode, observe

    def __enter__(self):
        return self.mode.__enter__()

    def __exit__(self, *exc_info):
        result = self.mode.__exit__(*exc_info)
        for leaf in tree_leaves(list(self.mode.storage.values())):
            tensor = getattr(leaf, "val", leaf)  # torch keeps each saved output in a _VersionWrapper
            if isinstance(tensor, torch.Tensor):
                self.observe(tensor)
        return result


def _contexts(save: frozenset, observe: Observer | None):
    if observe is None or _POLICY_SEES_OUTPUT:
        return partial(create_selective_checkpoint_contexts, partial(_policy, save, observe))

    def contexts():
        forward, recompute = create_selective_checkpoint_contexts(partial(_policy, save, None))
        return _ObserveSaved(forward, observe), recompute

    return contexts


def checkpointed(forward: Callable, *args, context_fn=None, **kwargs):
    """forward(*args, **kwargs) under non-reentrant checkpoint. Every tensor goes in as a
    positional argument, so checkpoint saves it with the saved-tensor hooks (which the profiler
    counts), keyword arguments (Hugging Face's position_embeddings) too."""
    leaves, spec = tree_flatten((args, kwargs))
    where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    rest = [None if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]  # no tensor held but by checkpoint

    def run(*tensors):
        filled = list(rest)
        for i, tensor in zip(where, tensors, strict=True):
            filled[i] = tensor
        call_args, call_kwargs = tree_unflatten(filled, spec)
        return forward(*call_args, **call_kwargs)

    extra = {} if context_fn is None else {"context_fn": context_fn}
    return checkpoint(run, *(leaves[i] for i in where), use_reentrant=False, **extra)


@contextmanager
def _submodules_checkpointed(modules: list[nn.Module], context_fn) -> Iterator[None]:
    """Each module's forward runs under checkpoint until the block ends; then it is its own again."""
    saved = []
    for module in modules:
        own = module.__dict__.get("forward")  # an instance forward someone set before us stays theirs
        saved.append((module, own))
        module.forward = partial(checkpointed, module.forward, context_fn=context_fn)
    try:
        yield
    finally:
        for module, own in reversed(saved):
            if own is None:
                del module.forward
            else:
                module.forward = own


# ---------------------------------------------------------------- offload


def _copy_streams(device: torch.device) -> tuple[torch.cuda.Stream, torch.cuda.Stream]:
    """The device's two copy streams (device to host, host to device: PCIe is full duplex),
    made once."""
    found = _STREAMS.get(device)
    if found is None:
        found = _STREAMS[device] = (torch.cuda.Stream(device), torch.cuda.Stream(device))
    return found


_STREAMS: dict[torch.device, tuple] = {}


class _Offloaded:
    """One storage a layer saved, on the host: its copy out (on the device-to-host stream, once
    the op that made it is done) and its copy back (on the host-to-device stream, once the copy
    out is done), which every saved view of it then reads."""

    def __init__(self, whole: torch.Tensor, *, move_cpu: bool):
        self.device, self.back = whole.device, None
        self.cuda = whole.is_cuda
        self.host = torch.empty(whole.shape, dtype=torch.uint8, pin_memory=self.cuda)
        self.weak = StorageWeakRef(whole.untyped_storage())
        if not self.cuda:  # move_cpu: a plain copy, for tests on a machine with no GPU
            self.host.copy_(whole)
            return
        out, _ = _copy_streams(self.device)
        out.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(out):
            self.host.copy_(whole, non_blocking=True)
            self.out_done = out.record_event()
        whole.record_stream(out)  # the caching allocator reuses the block only after the copy

    def fetch(self) -> None:
        """Start the copy back (prefetch): overlapped with the compute stream's work."""
        if self.back is not None:
            return
        self.back = torch.empty(self.host.shape, dtype=torch.uint8, device=self.device)
        if not self.cuda:
            self.back.copy_(self.host)
            return
        _, back = _copy_streams(self.device)
        back.wait_stream(torch.cuda.current_stream(self.device))  # the block is free on the compute stream
        back.wait_event(self.out_done)
        with torch.cuda.stream(back):
            self.back.copy_(self.host, non_blocking=True)
            self.back_done = back.record_event()
        self.back.record_stream(back)

    def view(self, dtype, size, stride, offset) -> torch.Tensor:
        self.fetch()
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(self.back_done)
        return torch.empty(0, dtype=dtype, device=self.device).set_(self.back.untyped_storage(), offset, size, stride)


class offloaded_activations(saved_tensors_hooks):  # noqa: N801 (a context manager, as torch's own)
    """Inside, every tensor autograd saves goes to host memory (pinned) and comes back for the
    backward, except those in `keep` (the layer's input, its parameters and buffers, by
    storage) and tensors already on the cpu: the host is their device.

    torch.autograd.graph.save_on_cpu copies every saved tensor one by one, on the compute
    stream: the weights a matmul saves (each microbatch a copy of the layer's parameters over
    PCIe and in host memory), the input the previous layer's output already is, and a tensor
    three matmuls save (the normed input of Q, K and V) three times, each waiting for the
    copy. Here a storage goes out once per forward, whole, on a copy stream of its own, so the
    forward goes on while it copies, and comes back once, on a second stream, when the
    backward reaches the layer (prefetch(): a hook on its output) or, failing that, first
    needs it; each saved view of it is rebuilt on that one copy, so the layer's backward holds
    what it moved once, as none holds it.

    observe(tensor): told every saved tensor that stays on its device (the profiler counts
    them as the option's kept bytes). move_cpu: copy cpu tensors too (the same code on a
    machine with no GPU, for tests)."""

    def __init__(self, keep=(), *, observe: Observer | None = None, move_cpu: bool = False):
        kept = {tensor.untyped_storage()._cdata for tensor in keep}
        # this forward's copies by storage; emptied when the forward ends, so that only the
        # saved tensors (the autograd nodes) hold a copy, and it goes when their backward is done
        self.copies: dict[int, _Offloaded] = {}
        self.moved: list[weakref.ref] = []  # in the order they were saved

        def pack(tensor: torch.Tensor):
            storage = tensor.untyped_storage()
            if storage._cdata in kept or (tensor.device.type == "cpu" and not move_cpu) or tensor.layout != torch.strided:
                if observe is not None:
                    observe(tensor)
                return tensor
            found = self.copies.get(storage._cdata)
            if found is None or found.weak.expired():  # a storage freed since may reuse the address
                whole = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)
                found = self.copies[storage._cdata] = _Offloaded(whole, move_cpu=move_cpu)
                self.moved.append(weakref.ref(found))
            return found, tensor.dtype, tensor.size(), tensor.stride(), tensor.storage_offset()

        def unpack(packed):
            if isinstance(packed, torch.Tensor):
                return packed
            found, *shape = packed
            return found.view(*shape)

        super().__init__(pack, unpack)

    def __exit__(self, *exc_info) -> None:
        super().__exit__(*exc_info)
        self.copies.clear()

    def prefetch(self) -> None:
        """Start copying back everything moved that a saved tensor still needs, the last saved
        first (the backward reads it first)."""
        for ref in reversed(self.moved):
            found = ref()
            if found is not None:
                found.fetch()
        self.moved = []


def offloading_runner(layer: nn.Module, observe: Observer | None, move_cpu: bool = False) -> Callable[[torch.Tensor], torch.Tensor]:
    """x -> layer(x) under offloaded_activations, keeping its input, parameters and buffers, and
    copying the rest back when the gradient of its output arrives (its backward starts)."""
    def run(x: torch.Tensor) -> torch.Tensor:
        hooks = offloaded_activations([x, *layer.parameters(), *layer.buffers()], observe=observe, move_cpu=move_cpu)
        with hooks:
            output = layer(x)
        if hooks.moved and isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda grad: hooks.prefetch())  # the layer's backward starts
        return output

    return run


def layer_runner(layer: nn.Module, option: str = OPTION_NONE, *,
                 observe: Observer | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """x -> layer(x) under recompute option `option`, its submodules found once (ValueError for an
    option find_options does not list). observe(tensor): told every tensor a selective policy saves."""
    if option == OPTION_NONE:
        return layer
    if option == OPTION_FULL:
        return partial(checkpoint, layer, use_reentrant=False)
    if option not in find_options(layer):
        raise ValueError(option_error(type(layer).__name__, layer, option))
    if option == OPTION_OFFLOAD:
        return offloading_runner(layer, observe)
    if option == SAVE_MATMULS:
        return partial(checkpoint, layer, use_reentrant=False,
                       context_fn=_contexts(MATMUL_OPS | ATTENTION_OPS, observe))
    parts = find_parts(layer)
    targets = _targets(parts, tuple(option.split(",")))
    selective = {id(module) for module in parts[MLP_ACT]} if MLP_ACT in option.split(",") else set()
    plain = [module for module in targets if id(module) not in selective]
    sac = [module for module in targets if id(module) in selective]

    def run(x: torch.Tensor) -> torch.Tensor:
        with _submodules_checkpointed(plain, None), _submodules_checkpointed(sac, _contexts(MATMUL_OPS, observe)):
            return layer(x)

    return run


def run_layer(layer: nn.Module, x: torch.Tensor, option: str = OPTION_NONE, *,
              observe: Observer | None = None) -> torch.Tensor:
    """layer(x) under recompute option `option` (layer_runner, once)."""
    return layer_runner(layer, option, observe=observe)(x)
