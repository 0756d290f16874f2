"""What DeepEP's and HybridEP's dispatch and combine kernels reach inside an NVLink domain, as their authors
published them (docs/framework-facts.md §116), and the bytes those figures count.

Megatron-core's flex token dispatcher (`--moe-token-dispatcher-type flex`) runs one of these backends in place of
NCCL's all_to_all_single (megatron/core/transformer/moe/fused_a2a.py at Megatron-LM d98e8a64: `HybridEPDispatch`
calls `HybridEPBuffer.dispatch_with_permute` forward and `combine_with_unpermute` backward, `HybridEPCombine` the
reverse; DeepEP's `Buffer.dispatch` / `combine` the same way). Both send a token once to each EP rank that holds one
of its top-k experts, not once per expert, and the benchmark that produced each table counts the bytes a rank
receives that way: `dispatched_hidden.numel() * 2` for BF16, the rank's own tokens included (DeepEP tests/
test_hybrid_ep.py `test_hybrid_ep_benchmark`, "algorithm bandwidth"); the combine the same bytes back. The figures
are the "Torch API" ones (the call Megatron makes, its host side and launch included; the handle given, so the
routing map's all-gather and metadata kernel are not in them), BF16 dispatch, 4,096 tokens a rank of hidden 7,168,
top 8, uniformly random routing over 8 local experts a rank.

Source: deepseek-ai/DeepEP docs/README_Hybrid-EP.md (the hybrid-ep branch's README, the tables of PR #420
"Add HybridEP solution for normal mode intranode dispatch/combine", 2025-09-21), read at 41cad944."""

from __future__ import annotations

from math import comb

HYBRIDEP_SOURCE = ("DeepEP docs/README_Hybrid-EP.md (41cad944; DeepEP PR #420): HybridEP on GB200, Torch API, BF16 "
                   "dispatch / combine GB/s by ranks and SMs, bytes = the tokens a rank receives, one copy a rank")
DEEPEP_SOURCE = ("DeepEP docs/README_Hybrid-EP.md (41cad944; DeepEP PR #420): DeepEP normal kernels on GB200 and B200, "
                 "Torch API, BF16 dispatch / combine GB/s by ranks and SMs")

# (GPU, ranks, SMs) -> (BF16 dispatch GB/s, combine GB/s), the Torch API columns
HYBRIDEP = {
    ("gb200", 8, 16): (550.10, 538.44), ("gb200", 8, 32): (545.71, 568.94),
    ("gb200", 16, 16): (472.84, 474.48), ("gb200", 16, 32): (523.48, 521.55),
    ("gb200", 24, 16): (441.89, 444.40), ("gb200", 24, 32): (507.32, 483.76),
    ("gb200", 32, 16): (485.50, 423.19), ("gb200", 32, 32): (484.22, 464.54),
    ("gb200", 36, 16): (469.96, 418.27), ("gb200", 36, 32): (479.02, 447.89),
    ("b200", 8, 16): (535.94, 530.86),
}
DEEPEP = {
    ("gb200", 8, 16): (362.01, 310.21), ("gb200", 8, 24): (512.72, 425.95), ("gb200", 8, 32): (615.78, 519.57),
    ("gb200", 16, 16): (328.80, 278.34), ("gb200", 16, 24): (442.47, 378.32), ("gb200", 16, 32): (520.76, 442.51),
    ("gb200", 24, 16): (324.64, 126.53), ("gb200", 24, 24): (450.22, 163.62), ("gb200", 24, 32): (502.84, 207.10),
    ("b200", 8, 16): (348.0, 302.0), ("b200", 8, 24): (494.0, 420.0), ("b200", 8, 32): (619.0, 524.0),
    ("b200", 8, 36): (635.0, 549.0), ("b200", 8, 40): (629.0, 570.0), ("b200", 8, 44): (640.0, 577.0),
    ("b200", 8, 48): (646.0, 586.0),
}
TABLES = {"hybridep": (HYBRIDEP, HYBRIDEP_SOURCE), "deepep": (DEEPEP, DEEPEP_SOURCE)}
# the SMs each backend's kernels take when the job names none: HybridEPBuffer's num_sms_dispatch_api /
# num_sms_combine_api defaults (deep_ep/hybrid_ep_buffer.py, 32 each, DeepEP 017a5202); DeepEP's Buffer.num_sms (20,
# deep_ep/buffer.py; Megatron-core's "historical default 20", transformer_config.py moe_deepep_num_sms at d98e8a64)
DEFAULT_SMS = {"hybridep": 32, "deepep": 20}


def ranks_per_token(experts: int, ep: int, topk: int) -> float:
    """The EP ranks a token's top-k experts fall on, expected under uniformly random distinct experts (what forced
    load balancing and the benchmark both route): a rank holding experts/ep of them is missed with probability
    C(E - E/ep, k) / C(E, k)."""
    local = experts // ep
    return ep * (1 - comb(experts - local, topk) / comb(experts, topk))


def rates(backend: str, gpu: str, ranks: int, sms: int) -> tuple[float, float, str] | None:
    """(dispatch GB/s, combine GB/s, how the row was taken) for `backend` on `gpu` at `ranks` ranks and `sms` SMs;
    None where the backend published no figure for that GPU. A rank count between the table's: the next larger
    one's (the rate falls as ranks grow: the nearer bound from below); past the largest: the largest's, said. SMs:
    the measured count nearest to `sms` (the lower on a tie), said where it is not `sms`."""
    table, _ = TABLES[backend]
    rows = [(r, s) for g, r, s in table if g == gpu]
    if not rows:
        return None
    measured = sorted({r for r, _ in rows})
    row_ranks = next((r for r in measured if r >= ranks), measured[-1])
    counts = sorted({s for r, s in rows if r == row_ranks})
    row_sms = min(counts, key=lambda s: (abs(s - sms), s))
    how = f"{backend} on {gpu} at {row_ranks} ranks, {row_sms} SMs"
    if row_ranks != ranks:
        how += (f" (the table's largest rank count; EP {ranks} is past it)" if ranks > measured[-1] else
                f" (the next measured rank count above EP {ranks})")
    if row_sms != sms:
        how += f" (the nearest measured SM count to {sms})"
    dispatch, combine = table[(gpu, row_ranks, row_sms)]
    return dispatch, combine, how
