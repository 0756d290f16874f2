"""A MoE block's token exchange: NCCL's all-to-all over the EP link (dataparallel.all_to_all_ms), or the flex
dispatcher's DeepEP / HybridEP kernels at their own published rates (planner/models/ep_dispatch_rates.py,
docs/framework-facts.md §116). Pure functions; nothing here reads a file or prints."""

from __future__ import annotations

from planner.cost.dataparallel import GB, all_to_all_ms


def ep_dispatch_pair_ms(a2a_bytes: float, backend) -> float:
    """One dispatch and one combine by DeepEP's or HybridEP's kernels (an EpDispatchSetup): each moves the
    routed copies' bytes a rank receives once a rank (a2a_bytes x rank_copies, its own tokens included, as the
    backends' benchmark counts them) at its own published rate."""
    received = a2a_bytes * backend.rank_copies
    return received / (backend.dispatch_gb_per_s * GB) * 1e3 + received / (backend.combine_gb_per_s * GB) * 1e3


def exchange_ms(a2a_bytes: float, data_parallel) -> float:
    """One token exchange of a MoE block (a dispatch or a combine, a2a_bytes of routed copies): NCCL's all-to-all at
    the EP link, or under the flex dispatcher's DeepEP / HybridEP (data_parallel.ep_dispatch) half a pair at its
    rates (every pass runs one of each)."""
    if data_parallel.ep_dispatch is not None:
        return ep_dispatch_pair_ms(a2a_bytes, data_parallel.ep_dispatch) / 2
    return all_to_all_ms(a2a_bytes, data_parallel.ep, data_parallel.ep_gb_per_s)
