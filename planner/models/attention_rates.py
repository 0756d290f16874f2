"""The attention kernel's rate on a GPU at a sequence length, from the GPU's published figures
(planner/models/gpus.py GPU.attention_efficiency, attention_by_seq). The profilers' roofline
(planner/profiler/roofline.py) times attention kernels with it, and the cost model's deterministic
backward (planner/cost/jobsettings.py) reads the same rate; Transformer Engine's attention reads the GPU's cuDNN
figures where published (te_attention_gpu: planner/profiler/te_fused.py, te_mla.py)."""

from __future__ import annotations

import dataclasses
import math

from planner.models.gpus import GPU


def attention_efficiency(gpu: GPU, seq_len: int) -> tuple[float, float]:
    """The attention kernel's (forward, backward) fraction of peak at `seq_len` tokens a sequence:
    log-linear between the GPU's published lengths, the nearest one's outside them; the GPU's one
    figure where no lengths are published or the length is not known."""
    points = gpu.attention_by_seq
    if not points or seq_len <= 0:
        return gpu.attention_efficiency
    if seq_len <= points[0][0]:
        return points[0][1:]
    for (sa, fa, ba), (sb, fb, bb) in zip(points, points[1:]):
        if seq_len <= sb:
            t = math.log(seq_len / sa) / math.log(sb / sa)
            return fa + (fb - fa) * t, ba + (bb - ba) * t
    return points[-1][1:]


def te_attention_gpu(gpu):
    """The GPU as TE's attention runs on it: its cuDNN figures in place of its attention figures where
    published (GPU.te_attention_efficiency), else the GPU as it is."""
    if not gpu.te_attention_efficiency:
        return gpu
    return dataclasses.replace(gpu, attention_efficiency=gpu.te_attention_efficiency, attention_by_seq=())
