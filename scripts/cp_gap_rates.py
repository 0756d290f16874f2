"""What one rate the 8B CP rows' shortfall would ask for, were it all in one term (docs/published-runs.md §33.cptime).

For each of torchtitan's 8B CP rows (C2-C4: one microbatch, 32 blocks a rank, the rank's 32,768 tokens in every row)
the published iteration less ckplan's is spread over the 32 blocks, and laid on one term at a time:
- the exchange: the bytes a rank receives a block (the forward's all-gather (cp - 1) KV, the backward's, which the
  compiled rerun shares, (cp - 1) KV more, and the cp fp32 dK/dV passes of 2 KV each: torch 2.6.0's
  `_templated_ring_attention(_backward)`, framework-facts §152) over ckplan's waited exchange plus the gap: the rate
  the link would have to run at;
- the flash calls: ckplan's flash time a block (forward, rerun, backward: the profile's CP record) over the same
  time plus the gap: the fraction of ckplan's attention rate the kernels would have to run at.
A term that is really missing should ask for one figure in every row; what these rows ask is printed beside the
C1 row's own ratio (no ring there).

    PYTHONPATH=. python scripts/cp_gap_rates.py RESULTS_DIR PROFILE_DIR

RESULTS_DIR: a `published_rows.py run --only C1,C2,C3,C4 --out RESULTS_DIR` folder; PROFILE_DIR: the rows' profiles
(.published-rows/profiles after `published_rows.py profiles --only C1,C2,C3,C4`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from published_rows import load_table  # noqa: E402

ROWS = (("C2", "l8_s65536_cp2"), ("C3", "l8_s131072_cp4"), ("C4", "l8_s262144_cp8"))
BLOCKS = 32  # LLaMA 3.1 8B's layers, all on the one pipeline rank, one microbatch (the rows' --layers-per-stage 34)


@dataclass(frozen=True)
class BlockTerms:
    """What ckplan charges a block of a CP row, and the bytes its exchange moves into a rank."""

    cp: int
    kv_bytes: int  # the rank's K and V as exchanged (repeated to the query heads), bf16
    exchange_ms: float  # the waited exchange a fully recomputed, compiled block pays (forward, rerun, backward)
    flash_ms: float  # the flash calls: forward, rerun and backward

    @property
    def received_bytes(self) -> int:
        """Two all-gathers' (cp - 1) KV (the forward's; the rerun's, which the backward ring reuses) and cp fp32
        dK/dV passes of 2 KV."""
        return 2 * (self.cp - 1) * self.kv_bytes + self.cp * 2 * self.kv_bytes


def implied(terms: BlockTerms, gap_s: float, blocks: int = BLOCKS) -> tuple[float, float]:
    """(the exchange's rate in GB/s, the flash calls' fraction of ckplan's rate) that would each alone close
    a row's gap (published less ckplan, s an iteration) spread over its blocks."""
    gap_ms = gap_s * 1e3 / blocks
    rate = terms.received_bytes / ((terms.exchange_ms + gap_ms) * 1e-3) / 1e9
    return rate, terms.flash_ms / (terms.flash_ms + gap_ms)


def block_terms(profile: dict) -> BlockTerms:
    """A row's block as ckplan charges it, from its profile's CP record (the compiled ring, waited where issued)."""
    from planner.cost import comm, contextparallel
    from planner.cost.layers import ExchangeCost
    from planner.models import archs
    from planner.schema import TrainSetup

    record = next(layer["context_parallel"] for layer in profile["layers"] if layer.get("context_parallel"))
    exchange = ExchangeCost(**record)
    link = comm.job_links(archs.gpu("h100-96g"), tp=1, cp=exchange.ranks, pp_stride=64, gpus_per_node=8,
                          nics_per_gpu=1)["cp"]
    setup = TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**40], precision="bf16-mixed",
                       runtime="torchtitan", runtime_version="9dec370", context_parallel=exchange.ranks,
                       cp=exchange.ranks, compile=True, cp_gb_per_s=link.gb_per_s,
                       cp_step_latency_ms=link.step_latency_ms)
    moved = contextparallel.as_exchanged(exchange, setup.training)
    forward = contextparallel.pass_exposed_ms(moved, "forward", "allgather", link, waited=True)
    backward = contextparallel.pass_exposed_ms(moved, "backward", "allgather", link, False, True)
    return BlockTerms(cp=exchange.ranks, kv_bytes=moved.kv_bytes, exchange_ms=2 * forward + backward,
                      flash_ms=2 * exchange.attention_fwd_ms + exchange.attention_bwd_ms)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not all(Path(a).is_dir() for a in argv):
        print("usage: cp_gap_rates.py RESULTS_DIR PROFILE_DIR (published_rows.py's run --out folder and its profiles)",
              file=sys.stderr)
        return 2
    results, profiles = Path(argv[0]), Path(argv[1])
    needed = [results / f"{row}.json" for row in ("C1", *(r for r, _ in ROWS))] + \
        [profiles / f"{name}.json" for _, name in ROWS]
    missing = [str(path) for path in needed if not path.is_file()]
    if missing:
        print(f"missing {', '.join(missing)}: run published_rows.py profiles / run --only C1,C2,C3,C4",
              file=sys.stderr)
        return 2
    published = {row.id: row.time_s for row in load_table().rows}
    ckplan = {path.stem: json.loads(path.read_text())["iteration_s"] for path in needed if path.parent == results}
    print(f"C1 (no ring): ckplan {ckplan['C1']:.3f} s of {published['C1']:g} ({ckplan['C1'] / published['C1']:.3f})")
    for row, name in ROWS:
        terms = block_terms(json.loads((profiles / f"{name}.json").read_text()))
        gap = published[row] - ckplan[row]
        rate, fraction = implied(terms, gap)
        print(f"{row} (cp {terms.cp}): gap {gap:.2f} s, {gap * 1e3 / BLOCKS:.1f} ms a block; a block receives "
              f"{terms.received_bytes / 1e9:.2f} GB in {terms.exchange_ms:.1f} ms waited "
              f"({terms.received_bytes / terms.exchange_ms / 1e6:.0f} GB/s), flash {terms.flash_ms:.1f} ms; "
              f"alone the exchange would run at {rate:.1f} GB/s, or the flash calls at {fraction:.3f} of ckplan's rate")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
