"""Megatron-LM's sliding-window attention flags as each layer's window (Arch.layer_windows), read as
NVIDIA/Megatron-LM d98e8a64 takes them:

- `--window-size L,R` (arguments.py 2384, `tuple_type`: "(L,R)" -> (L, R)): TE's DotProductAttention gets
  window_size (L, R) on a windowed layer (extensions/transformer_engine.py 2163-2172), under which query i attends
  the keys [i - L, i + R] inclusive (transformer_engine/pytorch/attention/dot_product_attention/
  dot_product_attention.py 221-224, TE v2.9): with R = 0 and the causal mask, L + 1 keys, itself among them, the
  window gptoss.window_pairs counts (GPT-OSS as Megatron-Bridge 00b7660b builds it: (128, 0), 129 keys;
  gpt_oss_provider.py 77). A negative L is TE's "no window" (-1).
- `--window-attn-skip-freq` (arguments.py 2387, `moe_freq_type`: N or a list expression of 0/1 a layer):
  utils.py 531-546 `is_layer_window_attention(window_size, freq, layer_number)`, layer_number counted from 1:
  no window without --window-size; every layer windowed without a frequency; with N, the layers whose number
  N does not divide (GPT-OSS's 2: layers 1, 3, 5, ... windowed, every second one full); with a list, layer n's
  entry (1: windowed).
"""

from __future__ import annotations

import re

from planner.errors import UserError
from planner.models.configs.megatron_args import Flags


def layer_windows(flags: Flags, layers: int) -> tuple[int | None, ...]:
    """Each decoder layer's window in keys (None: full causal attention); () where no layer is windowed."""
    size = flags.take("--window-size", "sliding-window attention: a windowed layer's query attends L keys before "
                      "it and itself (TE's window_size (L, 0))", str)
    freq = flags.take("--window-attn-skip-freq", "which layers are windowed (N: every Nth layer full; or a 0/1 "
                      "list, 1 windowed)", str)
    if size is None:
        return ()
    parts = [p.strip() for p in size.strip().strip("\"'").strip("()[]").split(",") if p.strip()]
    if len(parts) != 2 or not all(re.fullmatch(r"-?\d+", p) for p in parts):
        raise UserError(f"--window-size {size!r} is not two whole numbers L,R (Megatron-LM's tuple_type); give "
                        "e.g. 128,0")
    left, right = int(parts[0]), int(parts[1])
    if left < 0:
        return ()  # TE's -1: no window on the left, the causal mask alone
    if right != 0:
        raise UserError(f"--window-size {left},{right} lets a query attend {right} later tokens, which a causal "
                        "decoder does not: ckplan models windows of the form L,0")
    windowed = _windowed(freq, layers)
    if not any(windowed):
        return ()
    return tuple(left + 1 if w else None for w in windowed)


def _windowed(freq: str | None, layers: int) -> list[bool]:
    """is_layer_window_attention for layer numbers 1 .. layers (the module's docstring)."""
    if freq is None:
        return [True] * layers
    text = freq.strip().strip("\"'")
    if text.isdigit():
        every = int(text)
        if every < 1:
            raise UserError(f"--window-attn-skip-freq {freq!r}: give a whole number from 1 (every layer full) or a "
                            f"list expression of {layers} zeros and ones")
        return [number % every != 0 for number in range(1, layers + 1)]
    pattern: list[int] = []
    for part in re.findall(r"\[([0-9, ]*)\](?:\s*\*\s*(\d+))?", text):
        pattern += [int(v) for v in part[0].split(",") if v.strip()] * int(part[1] or 1)
    if len(pattern) != layers or not re.fullmatch(r"[\[\]0-9,*+() ]+", text) or set(pattern) - {0, 1}:
        raise UserError(f"--window-attn-skip-freq {freq!r}: give N or a list expression of {layers} zeros and ones, "
                        "e.g. [1,0]*18")
    return [bool(v) for v in pattern]
