"""The attention kernel's rate on a GPU at a sequence length, from the GPU's published figures
(planner/models/gpus.py GPU.attention_efficiency, attention_by_seq). The profilers' roofline
(planner/profiler/roofline.py) times attention kernels with it, and the cost model's deterministic
backward (planner/cost/jobsettings.py) reads the same rate; Transformer Engine's attention reads the GPU's cuDNN
figures where published (te_attention_gpu: planner/profiler/te_fused.py, te_mla.py), and a sliding window at
cuDNN's published windowed rate there (windowed_efficiency; torch's flash kernel has no windowed figure published:
a window under SDPA or FlashAttention runs at the full kernel's rate, its FLOPs the window's)."""

from __future__ import annotations

import dataclasses
import math

from planner.models.gpus import GPU


def attention_efficiency(gpu: GPU, seq_len: int, window: int = 0) -> tuple[float, float]:
    """The attention kernel's (forward, backward) fraction of peak at `seq_len` tokens a sequence:
    log-linear between the GPU's published lengths, the nearest one's outside them; the GPU's one
    figure where no lengths are published or the length is not known. `window` (below seq_len): a
    causal sliding window, at the kernel's published windowed rate where there is one (windowed_efficiency),
    else at the full kernel's."""
    if 0 < window < seq_len and gpu.attention_windowed:
        return windowed_efficiency(gpu, seq_len, window)
    return _full_efficiency(gpu, seq_len)


def _by_seq(points, seq_len: int) -> tuple[float, float]:
    """(forward, backward) log-linear in tokens between (tokens, forward, backward) points, the nearest outside."""
    if seq_len <= points[0][0]:
        return points[0][1:]
    for (sa, fa, ba), (sb, fb, bb) in zip(points, points[1:]):
        if seq_len <= sb:
            t = math.log(seq_len / sa) / math.log(sb / sa)
            return fa + (fb - fa) * t, ba + (bb - ba) * t
    return points[-1][1:]


def windowed_efficiency(gpu: GPU, seq_len: int, window: int) -> tuple[float, float]:
    """A causal sliding window's kernel rate (GPU.attention_windowed, cuDNN's published figures): at each
    published window, log-linear in tokens (_by_seq); between two published windows log-linear in the window;
    below the smallest, the smallest's (a smaller window runs slower on every published pair: an upper bound);
    above the largest, log-linear from the largest's rate to the full causal kernel's at a window of seq_len
    (where the window stops masking anything)."""
    windows = sorted({w for w, *_ in gpu.attention_windowed})
    at = {w: _by_seq([(s, f, b) for ww, s, f, b in gpu.attention_windowed if ww == w], seq_len) for w in windows}
    if window <= windows[0]:
        return at[windows[0]]
    lower = max(w for w in windows if w <= window)
    upper = min((w for w in windows if w > window), default=None)
    (fa, ba), ends = at[lower], (upper, at[upper]) if upper else (seq_len, _full_efficiency(gpu, seq_len))
    top, (fb, bb) = ends
    if top <= lower:
        return fa, ba
    t = math.log(window / lower) / math.log(top / lower)
    return fa + (fb - fa) * t, ba + (bb - ba) * t


def _full_efficiency(gpu: GPU, seq_len: int) -> tuple[float, float]:
    points = gpu.attention_by_seq
    if not points or seq_len <= 0:
        return gpu.attention_efficiency
    return _by_seq(points, seq_len)


def te_attention_gpu(gpu):
    """The GPU as TE's attention runs on it: its cuDNN figures in place of its attention figures where
    published (GPU.te_attention_efficiency), with cuDNN's sliding-window figures (GPU.te_attention_windowed), else
    the GPU as it is."""
    if not gpu.te_attention_efficiency:
        return gpu
    return dataclasses.replace(gpu, attention_efficiency=gpu.te_attention_efficiency, attention_by_seq=(),
                               attention_windowed=gpu.te_attention_windowed)
