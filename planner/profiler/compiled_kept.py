"""A block's kept bytes under torch.compile, per token, as AOTAutograd's partition decides them
(planner/profiler/compiled.py traces it; tests/test_compiled.py and scripts/compiled_block.py check
these formulas against it), and the profile as `--compile` charges it.

torchtitan's LLaMA block (dense SwiGLU, flash attention, K/V repeated to every head before sdpa),
d bytes per element, widths h (hidden), q (query heads x head size), kv (K/V heads x head size),
f (SwiGLU), a heads:
- no recompute: the input; the attention norm's 1/rms (fp32) and output; Q and the repeated K and V
  (sdpa's inputs, q wide each); sdpa's output and logsumexp (fp32 per head); wo's output (the
  residual sum is recomputed from it and the input); the MLP norm's 1/rms and output; the gate, the
  up projection and their product. Recomputed: the norms' fp32 casts, the rotary product, SiLU's
  output: d(4h + 4q + 3f) + 4·2 + 4a per token.
- torchtitan's op-level SAC: the input, wq's, wv's and w1's outputs, sdpa's output and logsumexp.
  w2's output is tagged saved but no backward op reads it, so the partition drops it (eager SAC
  caches it): d(h + 2q + kv + f) + 4a per token.
- whole-block checkpoint: the input, d·h per token (and the generator state to rerun sdpa: a
  seed and an offset on CUDA).
Checked at full size for LLaMA 3 8B (batch 2 x 8,192 tokens: 151,688, 55,424 and 8,192 B per token,
the partition and the formulas agree) and at the tests' tiny block. Not checked, so not recorded:
tensor parallelism (its collectives' outputs are forced saved, partitioners.py force_save_collectives),
mixtures of experts, latent attention, q/k norms, eager attention, a layer without rotary (SmolLM3's NoPE
layers: the partition was read on a block that rotates Q and K, and no block without was traced).
"""

from __future__ import annotations

from planner.models.archs import Arch
from planner.profiler.formulas import Shape, kv_width, q_width
from planner.schema import OPTION_FULL, OPTION_NONE

FP32 = 4
OPTION_OP_SAC = "op-sac"  # planner/profiler/opsac.py's name (not imported: it imports the roofline)


def compiled_kept_bytes(arch: Arch, shape: Shape, *, moe: bool) -> dict[str, int]:
    """Per recompute option, what the block keeps per microbatch under torch.compile; {} for a
    block the formulas were not checked on (the module's docstring)."""
    if (arch.style != "llama" or moe or arch.mla or arch.qk_norm or arch.sliding_window or not arch.rotates
            or shape.attention != "flash" or shape.tp != 1):
        return {}
    tokens, d, h, f = shape.tokens, shape.d, arch.hidden_size, arch.intermediate_size
    q, kv, heads = q_width(arch, shape), kv_width(arch, shape), arch.num_heads
    return {
        OPTION_NONE: tokens * (d * (4 * h + 4 * q + 3 * f) + 2 * FP32 + FP32 * heads),
        OPTION_FULL: tokens * d * h,
        OPTION_OP_SAC: tokens * (d * (h + 2 * q + kv + f) + FP32 * heads),
    }


def compiled_layers(profile):
    """(the profile as torch.compile runs it, the number of layers changed): each layer's kept
    bytes per option replaced by the compiled figures it recorded; what an option recomputes at
    once in its backward charged as what compiled no-recompute keeps beyond what it keeps (every
    recomputed tensor live together: inductor fuses some away, so this is an upper bound). The
    layer's transient (its gradients) stays the eager one: the partition does not change them.
    Layers without figures are left as they are."""
    from planner.profiler import allocseq

    layers, changed = [], 0
    for layer in profile.layers:
        figures = layer.compiled_kept_bytes
        if not figures or not layer.recompute_options:
            layers.append(layer)
            continue
        changed += 1
        act = figures.get(OPTION_NONE, layer.act_bytes)
        options = [_option(option, figures, act) for option in layer.recompute_options]
        compiled = layer.model_copy(update={"act_bytes": act, "recompute_options": options})
        if layer.alloc_records:  # the replay's records remade from the compiled kept bytes
            compiled = allocseq.synthesised(compiled, [layer.input_in_act_bytes, act - layer.input_in_act_bytes])
            compiled = compiled.model_copy(update={"alloc_records": _option_records(layer, compiled, figures)})
        layers.append(compiled)
    return profile.model_copy(update={"layers": layers}), changed


def _option(option, figures: dict[str, int], act: int):
    if option.name == OPTION_NONE:
        return option.model_copy(update={"kept_bytes": act})
    if option.name not in figures:
        return option
    kept = figures[option.name]
    return option.model_copy(update={"kept_bytes": kept, "recompute_peak_bytes": max(0, act - kept)})


def _option_records(eager, compiled, figures: dict[str, int]) -> dict:
    """The compiled layer's records: none's and full's (allocseq.synthesised), each other option the compiled
    figures name keeping its compiled bytes as one tensor and rerunning the rest at once (allocseq.kept_then_rerun:
    every recomputed tensor live together, as _option charges it); an option they do not name keeps its eager
    record, as it keeps its eager bytes."""
    from planner.profiler import allocseq

    records = {**eager.alloc_records, **compiled.alloc_records}
    none = compiled.alloc_records[OPTION_NONE]
    for option in compiled.recompute_options:
        if option.name in figures and option.name not in (OPTION_NONE, OPTION_FULL):
            kept = option.kept_bytes - compiled.input_in_act_bytes
            records[option.name] = allocseq.kept_then_rerun(none, [kept] if kept > 0 else [],
                                                            option.recompute_peak_bytes)
    return records
