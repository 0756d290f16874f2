"""The op class of a memory-bound op under the fake profiler: which module runs it.

planner/profiler/membound.py charges each eager op class (OP_CLASSES) at its own measured rate;
the analytic profile classes its bytes by formula (analytic_time), the fake profile (fake.OpBytes)
by the innermost module running each op, forward and backward, as torch's ModuleTracker tracks
them (torch/utils/module_tracker.py, torch 2.13).
"""

from __future__ import annotations

from torch.utils.module_tracker import ModuleTracker


def op_class(module_type: str) -> str:
    """The memory-bound op class (planner/profiler/membound.py OP_CLASSES) of an op run by a module of
    class `module_type` itself (not by a child): what the analytic profile classes the same ops as
    (analytic_time). Norms by name (Hugging Face's *RMSNorm, torch's RMSNorm and LayerNorm); the
    attention module's own ops (rotary, Q/K/V's gradient sums, eager softmax); the MLP's or an
    activation module's (SiLU and the product, GELU); everything else (the block's residual adds,
    a Linear's bias-gradient sum, dropout, lookups) is elementwise."""
    if "LayerNorm" in module_type:
        return "layer_norm"
    if module_type.endswith("Norm"):
        return "norm"
    if "Attention" in module_type:
        return "attention"
    if any(word in module_type for word in ("MLP", "FeedForward", "Expert", "SiLU", "GELU", "Activation")):
        return "activation"
    return "elementwise"


class Tracker(ModuleTracker):
    """torch's ModuleTracker (which modules run, forward and backward) that also keeps the order they
    were entered: the innermost is the last entered still running (in backward a module is entered
    when its output's gradient is ready and left when its input's is)."""

    def __init__(self) -> None:
        super().__init__()
        self._entered: list[str] = []
        self._root = "Global"

    def _get_append_fn(self, name, is_bw):
        append = super()._get_append_fn(name, is_bw)

        def entered(*args) -> None:
            append(*args)
            if not self._entered and self._root == "Global":
                self._root = name
            self._entered.append(name)

        return entered

    def innermost(self) -> str:
        """The module running now; in backward with none entered, the outermost module the region ran
        (the one whose output the backward starts from: torch's tracker never enters it then)."""
        while self._entered and self._entered[-1] not in self.parents:
            self._entered.pop()
        return self._entered[-1] if self._entered else self._root
