"""A tied set: one parameter several pipeline layers share (the profile's `tied`)."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import Field

from planner.schema.fields import Bytes, Ms, Strict


class TiedSet(Strict):
    """A parameter several pipeline layers share (tied weights: GPT-2's token embedding
    and LM head). Split across stages, each holding stage keeps a copy (its weights,
    gradient and optimizer state are in every holder's param bytes) and the copies'
    gradients are summed before every optimizer step."""

    layers: list[str] = Field(min_length=2)  # the layers holding it, in model order
    param_count: int = Field(ge=0)
    param_bytes: Bytes
    # the two uses' gradients added, as autograd's InputBuffer does where one stage holds both: measured
    # (measure.tied_sets) or its roofline (analytic_tied.tied_sum_ms); read on one stage (cost/tiedadd.py). Across
    # stages the cost model charges the all-reduce between the holders from bytes over their link (rules.tied_sum_ms).
    sum_ms: Ms = 0.0

    def extra_holders(self, chunks: Iterable[set[str]], *, among: set[str] | None = None) -> int:
        """How many of a rank's chunks (their layer names) hold it beyond the first: one module over the chunks holds
        it once (a V puts the token embedding and the LM head on rank 0). `among`: only those layers count."""
        mine = set(self.layers) if among is None else set(self.layers) & among
        return max(0, sum(bool(mine & chunk) for chunk in chunks) - 1)
