"""The SMs Transformer Engine's userbuffers take from the GEMMs a tensor-parallel block's collectives overlap
(Megatron-LM's --tp-comm-overlap; framework-facts §137).

Under --tp-comm-overlap TE's initialize_ub (transformer_engine/pytorch/module/base.py, TransformerEngine v2.9, the
TE Megatron-Bridge 25.11 runs) makes one userbuffers communicator per GEMM it overlaps, each with a method:
  - "ring_exchange" (qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad by default): the GEMM in tp chunks, each chunk's
    peer exchange a copy-engine copy (use_ce True, the default: cudaMemcpyAsync between peers, no SM); where its
    config sets set_sm_margin the GEMM runs on num_sm fewer SMs (Bridge's proj_fprop and fc2_fprop: 1);
  - "pipeline" (proj_fprop, fc2_fprop by default): the GEMM in num_splits chunks, each chunk's reduce-scatter a
    userbuffers kernel on num_sm SMs (16 by default), the GEMM with set_sm_margin on the SMs left;
  - "bulk" (qkv_dgrad, qkv_wgrad, fc1_dgrad, fc1_wgrad): one userbuffers kernel on num_sm SMs (16 by default) beside
    the whole GEMM: qkv_dgrad / fc1_dgrad all-gather the layer norm's output for the weight gradient beside the
    input-gradient GEMM, qkv_wgrad / fc1_wgrad reduce-scatter the input gradient beside the weight-gradient GEMM.
get_default_config (base.py 327-348): num_sm 1 for ring_exchange else 16, set_sm_margin for every method but
ring_exchange, use_ce True; a user's ub_cfgs entry updates the default (base.py 470-480). Megatron-LM passes its
--tp-comm-overlap-cfg file's entries (none: TE's defaults; read by planner/models/configs/ub_cfg.py, §154);
Megatron-Bridge passes its recipe's
TransformerLayerTPOverlapCfg (src/megatron/bridge/training/comm_overlap.py at 00b7660b: RingExchangeOverlapCfg
num_sm 1, cga_size 1, set_sm_margin False unless given; BulkOverlapCfg and PipelineOverlapCfg as given).

Charged at first order, as nccl_sms.py charges NCCL's CTAs: while a collective of T ms runs on c SMs of the GPU's
S, the GEMM beside it loses c x T / S ms of work (a margin'd GEMM runs on S - c for at least T: a floor). The
pass's compute ends at W + lost where that is past the collectives (comm.layer_comm_ms). The two bulk all-gathers
the profile does not list (analytic_comm.py leaves out the weight gradient's second all-gather) take the bytes of
the forward's all-gather at its site."""

from __future__ import annotations

from dataclasses import dataclass

_TE = "TransformerEngine v2.9 transformer_engine/pytorch/module/base.py 302-348 (methods, get_default_config)"
_BRIDGE = "Megatron-Bridge 00b7660b src/megatron/bridge/training/comm_overlap.py"


@dataclass(frozen=True)
class Overlap:
    """One GEMM's userbuffers overlap: its method and the SMs its communication takes from the GEMM."""

    method: str  # "ring_exchange", "pipeline" or "bulk"
    num_sm: int
    set_sm_margin: bool
    use_ce: bool = True  # a ring exchange's peer copies on the copy engines (TE's default)
    aggregate: bool = False  # a ring-exchange all-gather's two chunks a GEMM (split_overlap_ag's _aggregate)

    @property
    def sms(self) -> int:
        """SMs the GEMM loses while the collective runs: a ring exchange's copies run on copy engines (use_ce) and
        take none unless its GEMM keeps a margin; without use_ce its copies are num_sm CTAs (userbuffers.cu
        2314-2340, framework-facts §137); a pipeline's or a bulk's kernel takes num_sm (TE passes them no use_ce)."""
        if self.method == "ring_exchange":
            return self.num_sm if self.set_sm_margin or not self.use_ce else 0
        return self.num_sm


_RING, _RING_MARGIN_1 = Overlap("ring_exchange", 1, False), Overlap("ring_exchange", 1, True)


def _bulk(num_sm: int) -> Overlap:
    return Overlap("bulk", num_sm, False)


# TE's defaults (get_default_config): what Megatron-LM runs under --tp-comm-overlap without --tp-comm-overlap-cfg
TE_DEFAULT = {"qkv_fprop": _RING, "fc1_fprop": _RING, "proj_dgrad": _RING, "fc2_dgrad": _RING,
              "proj_fprop": Overlap("pipeline", 16, True), "fc2_fprop": Overlap("pipeline", 16, True),
              "qkv_dgrad": Overlap("bulk", 16, True), "qkv_wgrad": Overlap("bulk", 16, True),
              "fc1_dgrad": Overlap("bulk", 16, True), "fc1_wgrad": Overlap("bulk", 16, True)}


def _bridge(qkv_dgrad: int, qkv_wgrad: int, fc1_dgrad: int, fc1_wgrad: int) -> dict[str, Overlap]:
    """Bridge 00b7660b's FP8 configs: ring exchanges everywhere but the four bulk GEMMs (set_sm_margin False), the
    fprops' reduce-scatters ring exchanges with a one-SM margin."""
    return {"qkv_fprop": _RING, "fc1_fprop": _RING, "proj_dgrad": _RING, "fc2_dgrad": _RING,
            "proj_fprop": _RING_MARGIN_1, "fc2_fprop": _RING_MARGIN_1, "qkv_dgrad": _bulk(qkv_dgrad),
            "qkv_wgrad": _bulk(qkv_wgrad), "fc1_dgrad": _bulk(fc1_dgrad), "fc1_wgrad": _bulk(fc1_wgrad)}


CONFIGS = {  # name -> per GEMM; None (no config named): TE's defaults
    "userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192": _bridge(4, 24, 2, 4),  # comm_overlap.py 108-119
    "userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192": _bridge(2, 24, 2, 2),  # 161-172
    "userbuffers_fp8_b200_h16384_tp4_cp2_mbs1_seqlen8192": _bridge(8, 32, 2, 8),  # 187-198
}
SOURCES = {None: _TE, **{name: f"{_BRIDGE} {name}" for name in CONFIGS}}

# a block's listed collectives under sequence parallelism, in analytic_asynctp's site order: the GEMM each overlaps
FORWARD_GEMMS = ("qkv_fprop", "proj_fprop", "fc1_fprop", "fc2_fprop")
BACKWARD_GEMMS = ("proj_dgrad", "qkv_wgrad", "fc2_dgrad", "fc1_wgrad")
UNLISTED_BULK_GATHERS = (("qkv_dgrad", 0), ("fc1_dgrad", 2))  # (GEMM, the forward site whose bytes it gathers)


def setup_fields(gpu, tp_overlap: str, *, config: str | None = None, gemms: dict | None = None) -> dict:
    """CommSetup's userbuffers fields, for `evaluate`/`solve` (commands/comm_setup.py) and `search`
    (solve/jobsearch.py) alike: under tp-comm-overlap the config (`config`: a Bridge name or the file read; None:
    TE's defaults), a file's GEMMs, the GPU's SMs (planner/models/gpu_sms.py, 0 where unknown: nothing charged) and
    the rate ring_reduce_bytes' reduce kernel and buffer_copy_bytes' copies run at (no measurement of either: the GPU's
    eager elementwise class, a streaming read of bf16 tensors and one write, planner/models/membound_rate.py), and the
    rate a ring exchange's
    peer copies run at (a copy engine's from one peer where published, planner/models/copy_engines.py; else none:
    NCCL's ring rate for the group, planner/cost/ub_ring.py); nothing otherwise."""
    from planner.models.copy_engines import peer_copy_rate
    from planner.models.gpu_sms import sm_count
    from planner.models.membound_rate import achieved_tbps

    if tp_overlap != "tp-comm-overlap":
        return {}
    sms = sm_count(gpu) or 0
    _check_margins(gemms or {}, sms)
    reduce_rate = achieved_tbps(gpu, "eager", "elementwise") * 1e3  # GB/s
    copy = peer_copy_rate(gpu.name)
    return dict(ub_cfg=config, gpu_sms=sms, ub_reduce_gb_per_s=reduce_rate,
                **({} if copy is None else {"tp_copy_gb_per_s": copy[0]}),
                **({} if gemms is None else {"ub_gemms": gemms}))


def _check_margins(gemms: dict, sms: int) -> None:
    """A GEMM with set_sm_margin runs on sm_count - num_sm SMs (TE v2.9 comm_gemm_overlap.cpp 98-100), handed to
    cuBLASLt as CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET where not 0 (cublaslt_gemm.cu 443-446): at num_sm >= the GPU's
    SMs none or fewer are left, which TE does not check: refused (`sms` 0, the GPU's count unknown: not checked)."""
    for name, gemm in gemms.items():
        gemm = gemm if isinstance(gemm, dict) else gemm.model_dump()  # the file's dicts, or CommSetup's UbGemm
        if sms and gemm["set_sm_margin"] and gemm["num_sm"] >= sms:
            from planner.errors import UserError

            raise UserError(f"--tp-comm-overlap-cfg: {name}.num_sm is {gemm['num_sm']} with set_sm_margin, and TE "
                            f"runs the GEMM on the GPU's {sms} SMs less num_sm (comm_gemm_overlap.cpp 98-100, TE "
                            f"v2.9), leaving it none: give fewer than {sms} or set_sm_margin false")


def overlaps(config: str | None, gemms: dict | None = None) -> dict[str, Overlap]:
    """Per GEMM: a --tp-comm-overlap-cfg file's (`gemms`, CommSetup.ub_gemms: TE's defaults updated with the file's
    entries, planner/models/configs/ub_cfg.py), else Bridge's config by name, else TE's defaults."""
    if gemms is not None:
        return {name: Overlap(g.method, g.num_sm, g.set_sm_margin, g.use_ce, g.aggregate) for name, g in gemms.items()}
    return TE_DEFAULT if config is None else CONFIGS[config]


def ring_reduce_bytes(collectives: list, which: str, *, config: str | None, tp: int,
                      gemms: dict | None = None) -> float:
    """The bytes TE's reduce kernel moves after each of a pass's ring-exchange reduce-scatters (`collectives`: a dense
    block's eight in site order, LayerCost.collectives; `which`: "fwd", "bwd" or "recompute"). TE v2.9's
    CommOverlapP2PBase::split_overlap_rs (comm_gemm_overlap.cpp 1118-1207) writes the GEMM's tp partial chunks of the
    output into its communication buffer, sends each to the rank that owns it, and then, on the main stream after
    every chunk's GEMM and copy, runs reduce_bf16 (userbuffers.cu 2709-2753): the tp chunks read (the whole partial
    output, bf16: TE's initialize_ub gives a ring exchange's reduce-scatter no FP8 buffer, base.py 475-479) and their
    sum written (1 / tp of it). The pipeline method reduces inside its userbuffers kernel, bulk's scatters likewise:
    nothing here. Only the forward's two reduce-scatters (proj_fprop, fc2_fprop) can be ring exchanges; 0 where the
    block does not list eight or tp is 1."""
    if tp <= 1 or len(collectives) != 8 or which == "bwd":
        return 0.0
    table, at = overlaps(config, gemms), 2 + ("fwd", "bwd", "recompute").index(which)
    return sum(c[at] * c[1] * (1 + 1 / tp) for gemm, c in zip(FORWARD_GEMMS, collectives[:4], strict=True)
               if c[0] == "reduce-scatter" and table[gemm].method == "ring_exchange")


# the all-gathers a dense block's pass fills through userbuffers (GEMM, site): qkv_fprop and fc1_fprop forward,
# proj_dgrad and fc2_dgrad backward; and the bulk reduce-scatters whose output is copied out of the buffer
BUFFER_GATHERS = {"fwd": (("qkv_fprop", 0), ("fc1_fprop", 2)), "recompute": (("qkv_fprop", 0), ("fc1_fprop", 2)),
                  "bwd": (("proj_dgrad", 4), ("fc2_dgrad", 6))}
BULK_SCATTERS = (("qkv_wgrad", 5), ("fc1_wgrad", 7))


def buffer_copy_bytes(collectives: list, which: str, *, config: str | None, tp: int, gemms: dict | None = None,
                      float8: bool = False) -> float:
    """The bytes a dense block's pass ("fwd", "bwd", "recompute") copies into and out of TE's userbuffers on the
    compute stream, each copy a read and a write (TE v2.9, docs/framework-facts.md §635-§637):
    - an all-gather through userbuffers starts with `fill_userbuffers_buffer_for_all_gather` (module/base.py
      502-560): the rank's shard (FP8 where `float8`, the quantized data alone; else bf16) copied into its chunk of
      the buffer by `copy_into_buffer`, a cudaMemcpyAsync. A ring exchange's (CommOverlapP2P: qkv_fprop, fc1_fprop,
      proj_dgrad, fc2_dgrad in TE's and Bridge's configs) runs on the current stream before the chunked GEMM
      (csrc/extensions/comm_gemm_overlap.cpp 246-277): charged. A bulk all-gather's (CommOverlap: qkv_dgrad,
      fc1_dgrad, the norm output gathered again for the weight gradient) runs on the communication stream beside the
      GEMM (147-181, bulk_overlap): hidden with its collective, not charged;
    - a bulk reduce-scatter of the input gradient beside the weight-gradient GEMM (qkv_wgrad, fc1_wgrad) leaves the
      rank's chunk in the buffer, which is not FP8 (initialize_ub gives FP8 buffers to all-gathers only, base.py
      287-299, 343), and after the main stream waits on it `dgrad = ub_obj_wgrad.get_buffer(local_chunk=True)
      .clone()` (layernorm_linear.py 927, linear.py 918): 1 / tp of the bf16 input gradient copied out.
    `collectives`: the block's eight in site order (their tensor bytes bf16 and whole); 0 where the block does not
    list eight or tp is 1."""
    if tp <= 1 or len(collectives) != 8:
        return 0.0
    table, at = overlaps(config, gemms), 2 + ("fwd", "bwd", "recompute").index(which)
    moved = sum(collectives[site][at] * 2 * (collectives[site][1] / 2 if float8 else collectives[site][1]) / tp
                for gemm, site in BUFFER_GATHERS[which]
                if collectives[site][0] == "all-gather" and table[gemm].method == "ring_exchange")
    if which == "bwd":
        moved += sum(collectives[site][at] * 2 * collectives[site][1] / tp for gemm, site in BULK_SCATTERS
                     if collectives[site][0] == "reduce-scatter" and table[gemm].method == "bulk")
    return moved


def lost_sm_ms(collective_ms: list[float], which: str, *, config: str | None, sms: int,
               gemms: dict | None = None, skip: frozenset = frozenset()) -> float:
    """The GEMM work a dense block's pass ("fwd", "bwd", "recompute") loses to the userbuffers' SMs: each of the pass's
    collectives (`collective_ms`: the block's eight in site order, each's ms once) x the SMs its overlap takes /
    `sms`, and in the backward the two bulk all-gathers of the forward's gathered bytes. 0 where the block does not
    list eight. `gemms`: a file's overlaps (overlaps); `skip`: GEMMs charged as their ring pipeline
    (planner/cost/ub_ring.py), which holds their SMs."""
    if not sms or len(collective_ms) != 8:
        return 0.0
    table = overlaps(config, gemms)
    # a grid past the SMs queues on them
    taken = {gemm: 0 if gemm in skip else min(overlap.sms, sms) for gemm, overlap in table.items()}
    if which == "bwd":
        lost = sum(taken[gemm] * ms for gemm, ms in zip(BACKWARD_GEMMS, collective_ms[4:], strict=True))
        lost += sum(taken[gemm] * collective_ms[site] for gemm, site in UNLISTED_BULK_GATHERS)
    else:
        lost = sum(taken[gemm] * ms for gemm, ms in zip(FORWARD_GEMMS, collective_ms[:4], strict=True))
    return lost / sms
