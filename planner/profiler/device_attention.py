"""Dropout in a fake profile made for a GPU (planner/profiler/fake.py).

A fake run executes torch's CPU kernels. With dropout, torch's CPU flash kernel refuses and
`F.scaled_dot_product_attention` takes the math path, which keeps the s x s probabilities
and the dropout mask; a GPU runs the fused kernel with dropout inside it and keeps what it
keeps without dropout. And `F.dropout` on the CPU multiplies by a noise tensor of the input's
dtype, which it keeps (2 bytes an element in bf16), where CUDA runs native_dropout's fused
kernel and keeps a bool mask (1 byte). `device_attention` gives the GPU's kernels back.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

# where torch decides which kernel attention runs, for the two devices a fake profile can mean
CUDA_ATTENTION_CHECKS = ("aten/src/ATen/native/transformers/cuda/sdp_utils.cpp can_use_flash_attention and "
                         "can_use_mem_efficient_attention: no dropout check")
CPU_ATTENTION_CHECKS = ("aten/src/ATen/native/transformers/sdp_utils_cpp.cpp use_flash_attention_cpp: "
                        "check_for_dropout, else the math path")


def _fused(sdpa, dropouts: set[float]):
    """`sdpa` with its dropout given to the fused kernel: called with dropout_p 0 (so the CPU
    kernels under the fake mode take their flash path, which keeps the output and the
    log-sum-exp as a GPU's fused kernel does with dropout; the RNG's seed and offset, 16 bytes,
    are not counted, nor the in-kernel dropout's time); each probability so given is added to
    `dropouts`."""

    def attention(*args, **kwargs):
        if len(args) > 4:
            dropouts.add(float(args[4]))
            args = (*args[:4], 0.0, *args[5:])
        elif "dropout_p" in kwargs:
            dropouts.add(float(kwargs["dropout_p"]))
            kwargs = {**kwargs, "dropout_p": 0.0}
        dropouts.discard(0.0)
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


@contextmanager
def device_attention(device_type: str):
    """Attention's dropout and F.dropout as `device_type` runs them; yields the set of dropout probabilities met
    (left empty for a CPU profile, which runs as the CPU runs). For a GPU,
    `torch.nn.functional.scaled_dot_product_attention` is `_fused` and `torch.nn.functional.dropout`
    `_native` until the block ends: a
    TorchFunctionMode would not do, since autograd runs a checkpoint's recompute with no
    torch-function mode on, and the recompute must run the kernel the forward ran."""
    dropouts: set[float] = set()
    if device_type == "cpu":
        yield dropouts
        return
    functional = torch.nn.functional
    own, own_dropout = functional.scaled_dot_product_attention, functional.dropout
    functional.scaled_dot_product_attention = _fused(own, dropouts)
    functional.dropout = _native(own_dropout)
    try:
        yield dropouts
    finally:
        functional.scaled_dot_product_attention, functional.dropout = own, own_dropout
