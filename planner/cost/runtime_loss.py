"""The loss region as a runtime's record states it (planner/cost/runtime_facts.py): the loss's memory as multiples
of the bf16 logits.

The loss region is a multiple of the bf16 logits tensor (tokens x vocab shard x 2 B): `kept` what
lives from the loss's forward to its backward (the logits themselves included where they stay),
`peak` the most at once during the loss's forward and backward. Measured with torch's MemTracker
on CPU (torch 2.13, 2,048 tokens x 4,096 vocab, bf16 logits; scripts/bench_loss_region.py,
its cases written from each framework's code): torchtitan's plain loss kept 2.00 peak 5.97
(compiled by inductor, read from its generated code instead, scripts/compiled_loss.py: kept 1.00
peak 2.00);
loss_parallel kept 2.00 peak 7.97; Hugging Face >= 4.46 (its output keeps the logits) kept 3.00
peak 6.97; transformers 4.3x as ColossalAI's benchmark runs it kept 4.00 peak 7.97; Megatron-LM's
vocab-parallel cross-entropy kept 2.00 peak 2.97."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LossRegion:
    """The loss's bytes as multiples of the bf16 logits (see the module's docstring)."""

    kept_x: float  # from the loss's forward to its backward, the logits included where they stay
    peak_x: float  # the most at once during the loss's forward and backward
    # the loss saves the logits themselves (kept_x counts them) and hands their storage back as their gradient
    # (Transformer Engine's fused cross-entropy writes it there): rules.loss_holds_logits; False: the stage
    # output holds 1x of kept_x, and the last layer receives a new gradient
    grad_in_logits: bool = False
    # kept_x counts the logits the loss is handed (the region saves them, or its caller keeps them: a compiled
    # loss's saved input, transformers' output object); False: kept_x is what the loss makes and saves alone
    # (torchtitan's eager cross_entropy(pred.float()): log_softmax's fp32 result, 2x, measured with `pred`
    # deleted, scripts/bench_loss_region.py), so a stage output that holds the logits holds them beside it
    kept_counts_logits: bool = True
