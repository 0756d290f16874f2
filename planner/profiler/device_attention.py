"""Attention's dropout in a fake profile made for a GPU (planner/profiler/fake.py).

A fake run executes torch's CPU kernels. With dropout, torch's CPU flash kernel refuses and
`F.scaled_dot_product_attention` takes the math path, which keeps the s x s probabilities
and the dropout mask; a GPU runs the fused kernel with dropout inside it and keeps what it
keeps without dropout. `device_attention` gives the GPU's kernel back.
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


@contextmanager
def device_attention(device_type: str):
    """Attention's dropout as `device_type` runs it; yields the set of dropout probabilities met
    (left empty for a CPU profile, which runs as the CPU runs). For a GPU,
    `torch.nn.functional.scaled_dot_product_attention` is `_fused` until the block ends: a
    TorchFunctionMode would not do, since autograd runs a checkpoint's recompute with no
    torch-function mode on, and the recompute must run the kernel the forward ran."""
    dropouts: set[float] = set()
    if device_type == "cpu":
        yield dropouts
        return
    functional = torch.nn.functional
    own = functional.scaled_dot_product_attention
    functional.scaled_dot_product_attention = _fused(own, dropouts)
    try:
        yield dropouts
    finally:
        functional.scaled_dot_product_attention = own
