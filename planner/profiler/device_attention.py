"""Dropout in a fake profile made for a GPU (planner/profiler/fake.py).

A fake run executes torch's CPU kernels. With dropout, torch's CPU flash kernel refuses and
`F.scaled_dot_product_attention` takes the math path, which keeps the s x s probabilities
and the dropout mask; a GPU runs the fused kernel with dropout inside it and keeps what it
keeps without dropout. And `F.dropout` on the CPU multiplies by a noise tensor of the input's
dtype, which it keeps (2 bytes an element in bf16), where CUDA runs native_dropout's fused
kernel and keeps a bool mask (1 byte). `device_attention` gives the GPU's kernels back.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

import torch

from planner.profiler import cuda_sdpa, fake_same

# where torch decides which kernel attention runs, for the two devices a fake profile can mean
CUDA_ATTENTION_CHECKS = ("aten/src/ATen/native/transformers/cuda/sdp_utils.cpp can_use_flash_attention and "
                         "can_use_mem_efficient_attention: no dropout check")
CPU_ATTENTION_CHECKS = ("aten/src/ATen/native/transformers/sdp_utils_cpp.cpp use_flash_attention_cpp: "
                        "check_for_dropout, else the math path")


@dataclass
class Ran:
    """What a fake run's attention calls were: the dropout probabilities given to the fused kernel, and the
    kernel torch's CUDA dispatcher picks for each call (cuda_sdpa.backend), by the pipeline layer running it
    ("" outside every layer); `capability` the GPU's compute capability x 10 (None: not read)."""

    dropouts: set[float] = field(default_factory=set)
    kernels: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    capability: int | None = None
    layer: str = ""

    def by_layer(self) -> dict[str, str]:
        """{layer: its kernel(s), ", "-joined where a layer's calls differ}."""
        return {name: ", ".join(sorted(found)) for name, found in self.kernels.items() if name}


_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def _call(args, kwargs) -> dict:
    given = dict(zip(_NAMES, args)) | kwargs
    return {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False} | given


def _cuda_call(given: dict, dropout: float) -> cuda_sdpa.Call:
    q, k, v = given["query"], given["key"], given["value"]
    return cuda_sdpa.Call(tuple(q.shape), tuple(k.shape), tuple(v.shape), str(q.dtype).removeprefix("torch."),
                          has_mask=given["attn_mask"] is not None, dropout=dropout, is_causal=bool(given["is_causal"]),
                          requires_grad=any(t.requires_grad for t in (q, k, v)))


def _cuda_op(kernel: str, given: dict):
    """The output of the CUDA kernel's own op (its meta kernel under the fake mode: its output, its saved
    tensors, its FLOPs in torch's counter), for a call the CPU would run on its math path: the log-sum-exp
    is computed where a gradient is wanted, as attention.cu's scaled_dot_product_attention asks."""
    q, k, v, mask = given["query"], given["key"], given["value"], given["attn_mask"]
    lse = any(t.requires_grad for t in (q, k, v))
    if kernel == cuda_sdpa.CUDNN:
        return torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, mask, lse, 0.0, bool(given["is_causal"]), False, scale=given["scale"])[0]
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, mask, lse, 0.0, bool(given["is_causal"]), scale=given["scale"])[0]


def _fused(sdpa, ran: Ran):
    """`sdpa` as the GPU runs it: its dropout given to the fused kernel, called with dropout_p 0 (so the CPU
    kernels under the fake mode take their flash path, which keeps the output and the log-sum-exp as a
    GPU's fused kernel does with dropout; the RNG's seed and offset, 16 bytes, are not counted, nor the
    in-kernel dropout's time); each probability so given is added to `ran.dropouts`. With the GPU's
    capability known, the kernel cuda_sdpa.backend picks is recorded, and where it is cuDNN's or the
    efficient kernel and V's head dim differs from Q's (a latent attention: the CPU's flash kernel refuses
    it and its math path would keep the scores) that kernel's own op runs instead."""

    def attention(*args, **kwargs):
        given = _call(args, kwargs)
        dropout = float(given["dropout_p"])
        if dropout:
            ran.dropouts.add(dropout)
        if len(args) > 4:
            args = (*args[:4], 0.0, *args[5:])
        elif "dropout_p" in kwargs:
            kwargs = {**kwargs, "dropout_p": 0.0}
        if ran.capability is None:
            return sdpa(*args, **kwargs)
        call = _cuda_call(given, dropout)
        kernel = cuda_sdpa.backend(call, ran.capability)
        ran.kernels[ran.layer].add(kernel)
        narrower_v = call.value[3] != call.query[3] and call.key[1] == call.query[1]
        if kernel in (cuda_sdpa.CUDNN, cuda_sdpa.EFFICIENT) and narrower_v:
            return _cuda_op(kernel, given)
        return sdpa(*args, **kwargs)

    return attention


# where torch picks dropout's kernel
CUDA_DROPOUT = ("aten/src/ATen/native/Dropout.cpp dropout: is_fused_kernel_acceptable (a CUDA input, 0 < p < 1) "
                "runs native_dropout, whose backward keeps its bool mask (tools/autograd/derivatives.yaml); else "
                "_dropout, which keeps a noise tensor of the input's dtype")


def _native(dropout):
    """`F.dropout` as CUDA runs it (CUDA_DROPOUT): torch.native_dropout where the fused kernel
    would run, `dropout` itself otherwise."""

    def drop(input, p=0.5, training=True, inplace=False):
        if training and 0 < p < 1 and not inplace and input.numel() > 0:
            return torch.native_dropout(input, p, True)[0]
        return dropout(input, p, training, inplace)

    return drop


def _entered(ran: Ran, name: str, module, args) -> None:
    ran.layer = name


def _noting(hook):
    """`hook` marked as only noting which layer runs (fake_same.NOTES_ONLY): a fake profile's layers
    equal in all else are still run once."""
    setattr(hook, fake_same.NOTES_ONLY, True)
    return hook


@contextmanager
def device_attention(device_type: str, gpu=None, layers=()):
    """Attention's dropout and F.dropout as `device_type` runs them; yields a Ran: the dropout probabilities
    met (left empty for a CPU profile, which runs as the CPU runs) and, with `gpu` (a gpus.GPU), each of
    `layers`' (name, module) attention kernels as that GPU's torch picks them. For a GPU,
    `torch.nn.functional.scaled_dot_product_attention` is `_fused` and `torch.nn.functional.dropout`
    `_native` until the block ends: a
    TorchFunctionMode would not do, since autograd runs a checkpoint's recompute with no
    torch-function mode on, and the recompute must run the kernel the forward ran."""
    ran = Ran(capability=cuda_sdpa.capability(gpu) if gpu is not None else None)
    if device_type == "cpu":
        yield ran
        return
    functional = torch.nn.functional
    own, own_dropout = functional.scaled_dot_product_attention, functional.dropout
    functional.scaled_dot_product_attention = _fused(own, ran)
    functional.dropout = _native(own_dropout)
    hooks = [module.register_forward_pre_hook(_noting(partial(_entered, ran, name))) for name, module in layers]
    try:
        yield ran
    finally:
        functional.scaled_dot_product_attention, functional.dropout = own, own_dropout
        for hook in hooks:
            hook.remove()


def kernels_note(ran: Ran, gpu_name: str) -> dict:
    """The profile's record of its attention kernels: `attention_kernels` {layer: kernel} (cuda_sdpa's names:
    cudnn, flash, efficient, math) and `attention_kernels_source`, what picked them."""
    return {"attention_kernels": ran.by_layer(),
            "attention_kernels_source": (f"torch's CUDA dispatcher at {gpu_name}'s compute capability "
                                         f"{ran.capability / 10:.1f} with cuDNN {cuda_sdpa.TORCH_CUDNN} "
                                         f"({cuda_sdpa.SDP_UTILS}; planner/profiler/cuda_sdpa.py)")}
