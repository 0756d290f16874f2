"""When an analytic block's eager forward frees each of its kept terms, and where it makes and frees what its
terms do not name (torchtitan 9dec370's LLaMA block, read line by line: docs/framework-facts.md §131, §136); used
by analytic.block_layer for allocseq.synthesised's `rerun_forward` and `rerun_points`. Moved out of analytic_kept.py
(its terms' names are analytic_kept's)."""

from __future__ import annotations

from planner.profiler.analytic_kept import Term

_ATTN_OUT, _PRODUCT = "attention output (output projection input)", "product (down projection input)"
# A LLaMA-style block with grouped-query attention under flash (no q/k norms, sinks or dropout) and a dense SwiGLU
# MLP, as torchtitan runs it (9dec370 torchtitan/models/llama/model.py): each kept term by the term after whose
# making the eager forward frees it where no saved tensor holds it (under torch.utils.checkpoint: framework-facts
# §127, §131), by Python's reference counts in that code; None: alive to the block's end.
# - 323 `h = x + self.attention(self.attention_norm(x), freqs_cis)`: the norm's output is the caller's argument,
#   alive until attention returns (after wo, 214); the norm's statistics die inside the norm;
# - 189-214: xq, xk, xv are locals to the return (xq rebound to its rotated view's storage); SDPA's logsumexp is
#   none of its results (F.scaled_dot_product_attention returns the output alone): freed as made; the output
#   projection's input (`output`, 210-213) until wo has run;
# - 324 `out = h + self.feed_forward(self.ffn_norm(h))`: h to the block's end; the MLP norm's output, the
#   argument, until feed_forward returns; 253 `self.w2(F.silu(self.w1(x)) * self.w3(x))`: w1's output dies once
#   SiLU has made its own, SiLU's and w3's once `*` has made the product (CPython 3.11's BINARY_OP drops both
#   operands before w2's CALL: `dis` of that line), the product once w2 has run.
# A sub-module's argument (LLAMA_FORWARD_ARGUMENTS) dies after that sub-module's own tensors freed at the same term:
# the caller's call holds it until the sub-module returns (and PrepareModuleInput's hook hands the module a new
# tuple, torch 1963fc8 tensor/parallel/style.py `_prepare_input_fn`, without releasing the caller's), so the MLP's
# input outlives the product and w2's casts; tests/test_f8cast2.py checks this order in the fake recorder's record
# of the real block under torch.utils.checkpoint.
# Not terms, so not played: the pre-rotary Q and K, repeat_kv's copies (201-202; K and V are held here at their
# own width to attention's end), SDPA's raw output, wo's and w2's outputs and the residual sums.
LLAMA_FORWARD_ARGUMENTS = frozenset({"Q/K/V projection input (norm output)",
                                     "MLP input (norm output), shared by gate and up"})
LLAMA_FORWARD_LAST_USE: dict[str, str | None] = {
    "attention norm input": None,
    "attention norm statistics (fp32 per token)": "Q/K/V projection input (norm output)",
    "Q/K/V projection input (norm output)": _ATTN_OUT,
    "Q after rotary": _ATTN_OUT,
    "K after rotary (K/V heads only)": _ATTN_OUT,
    "V (K/V heads only)": _ATTN_OUT,
    "softmax statistics, logsumexp (fp32 per head and token)": "softmax statistics, logsumexp (fp32 per head and token)",
    _ATTN_OUT: _ATTN_OUT,
    "MLP norm input": None,
    "MLP norm statistics (fp32 per token)": "MLP input (norm output), shared by gate and up",
    "MLP input (norm output), shared by gate and up": _PRODUCT,
    "gate projection output (SiLU input)": "SiLU output (first factor)",
    "SiLU output (first factor)": _PRODUCT,
    "up projection output (second factor)": _PRODUCT,
    _PRODUCT: _PRODUCT,
}


# where in that forward each part of what the record does not name is made and freed (fsdp2_layers.forward_program):
# the point's term and whether it falls before its making ("before"), right after it ("made": before the frees that
# follow it) or after those frees ("after"). torchtitan 9dec370 parallelize_llama.py 158-173: `attention` and
# `feed_forward` take their input through PrepareModuleInput (Shard(1) -> Replicate()), so TP + SP's gathered
# input is made when the norm has returned and is the module's argument until it returns (model.py 323-324);
# model.py 201-202 `keys = repeat_kv(xk, ...)`, `values` likewise, Attention.forward's locals from before SDPA
# to its return; context parallelism's K/V buffers live for the SDPA call; a Float8 linear's casts for its matmul
# (fsdp2_split: torchao eab345c `Float8Linear.forward` casts its input, then its weight, before the matmul, and
# torch's checkpoint keeps neither): wq's, wk's and wv's before Q, K and V are made (model.py 190: the three matmuls
# run before rotary, whose outputs are the terms), w1's before the gate's output, w3's before the up projection's,
# their shared input's cast (compiled, CSE) until w3's output is made, wo's once the output projection's input is
# made until attention returns; the largest, the fallback where no linear's casts are recorded (`w2`: w2's input
# beside the product), and w2's own from where the product is w2's argument (fsdp2_split) until feed_forward returns.
# `attention_sum`: model.py 323's `h = x + ...` made, the last reader of wo's reduce-scattered output (fsdp2_split's
# row-parallel partial sums, docs/framework-facts.md §149).
LLAMA_FORWARD_POINTS: dict[str, tuple[str, str]] = {
    "attention": ("Q/K/V projection input (norm output)", "after"),
    "qkv": ("Q after rotary", "before"),
    "wo": (_ATTN_OUT, "made"),
    "w1": ("gate projection output (SiLU input)", "before"),
    "w3": ("up projection output (second factor)", "before"),
    "w13_end": ("up projection output (second factor)", "made"),
    "sdpa": ("softmax statistics, logsumexp (fp32 per head and token)", "before"),
    "sdpa_end": ("softmax statistics, logsumexp (fp32 per head and token)", "after"),
    "attention_end": (_ATTN_OUT, "after"),
    "attention_sum": ("MLP norm input", "made"),
    "mlp": ("MLP input (norm output), shared by gate and up", "after"),
    "w2": (_PRODUCT, "made"),
    "mlp_end": (_PRODUCT, "after"),
}


def forward_points(terms: list[Term]) -> dict[str, tuple[int, str]] | None:
    """LLAMA_FORWARD_POINTS by index into `terms`, where forward_last_uses reads the block; None elsewhere."""
    if forward_last_uses(terms) is None:
        return None
    names = [term.what for term in terms]
    if any(name not in names for name, _ in LLAMA_FORWARD_POINTS.values()):
        return None
    return {point: (names.index(name), where) for point, (name, where) in LLAMA_FORWARD_POINTS.items()}


def forward_last_uses(terms: list[Term]) -> tuple[int | None, ...] | None:
    """For each of a block's kept terms, the index of the term after whose making its eager forward frees it
    (None: alive to the block's end), where the block's family has been read (LLAMA_FORWARD_LAST_USE); None
    where it has not (another family, or a term the table does not name)."""
    names = [term.what for term in terms]
    if len(set(names)) != len(names) or any(name not in LLAMA_FORWARD_LAST_USE for name in names):
        return None
    deaths = []
    for at, name in enumerate(names):
        last = LLAMA_FORWARD_LAST_USE[name]
        if last is not None and (last not in names or names.index(last) < at):
            return None
        deaths.append(None if last is None else names.index(last))
    return tuple(deaths)


def forward_freed_last(terms: list[Term]) -> frozenset[int]:
    """The indices of the kept terms that are a sub-module's argument (LLAMA_FORWARD_ARGUMENTS), freed after the
    other terms freed at the same point; empty where forward_last_uses does not read the block."""
    if forward_last_uses(terms) is None:
        return frozenset()
    return frozenset(at for at, term in enumerate(terms) if term.what in LLAMA_FORWARD_ARGUMENTS)
