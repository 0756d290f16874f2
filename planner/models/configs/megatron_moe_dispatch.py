"""Megatron-LM's MoE token dispatcher as a config names it, and the setup's record of its backend where it is
not NCCL's all-to-all (docs/framework-facts.md §116).

Megatron-core (d98e8a64, megatron/core/transformer/transformer_config.py 890-990, 1740-1790):
`--moe-token-dispatcher-type` allgather (its default), alltoall or flex; under flex, `--moe-flex-dispatcher-backend`
deepep (the default), hybridep or ncclep; `--moe-enable-deepep` is the deprecated spelling of flex + deepep (refused
beside hybridep). The SMs the backend's kernels take: `--moe-flex-dispatcher-num-sms`, or the deprecated
`--moe-hybridep-num-sms` / `--moe-deepep-num-sms` routed to it; none: the backend's own default
(ep_dispatch_rates.DEFAULT_SMS). Megatron-Bridge 25.11's performance runs set 32 for HybridEP
(scripts/performance/utils/overrides.py `_set_common_perf_overrides`, 00b7660b: `moe_hybridep_num_sms = 32`)."""

from __future__ import annotations

from planner.errors import UserError
from planner.models.configs.megatron_args import Flags

DISPATCHERS = ("allgather", "alltoall", "flex")
BACKENDS = ("deepep", "hybridep", "ncclep")


def read(flags: Flags, job) -> None:
    """job.ep_backend: (backend, SMs) where the flex dispatcher runs DeepEP or HybridEP; None otherwise."""
    kind = flags.take("--moe-token-dispatcher-type", "token dispatcher (alltoall, allgather: NCCL's collectives at "
                      "the EP link; flex: its backend's own rates, planner/models/ep_dispatch_rates.py)", str,
                      "allgather")
    if kind not in DISPATCHERS:
        raise UserError(f"--moe-token-dispatcher-type {kind}: Megatron-LM takes {', '.join(DISPATCHERS)}; give one")
    deepep = flags.take("--moe-enable-deepep", "DeepEP's kernels for the flex dispatcher (deprecated spelling of "
                        "--moe-flex-dispatcher-backend deepep)", bool, False)
    backend_given = flags.has("--moe-flex-dispatcher-backend")
    backend = flags.take("--moe-flex-dispatcher-backend", "the flex dispatcher's backend", str, "deepep")
    if backend not in BACKENDS:
        raise UserError(f"--moe-flex-dispatcher-backend {backend}: Megatron-LM takes {', '.join(BACKENDS)}; give one")
    if deepep and kind != "flex":
        raise UserError("--moe-enable-deepep needs --moe-token-dispatcher-type flex (Megatron-core refuses it "
                        "with any other dispatcher)")
    if deepep and backend == "hybridep":
        raise UserError("--moe-enable-deepep and --moe-flex-dispatcher-backend hybridep name two backends; "
                        "Megatron-core takes one: drop one of them")
    sms = None
    for flag in ("--moe-flex-dispatcher-num-sms", "--moe-hybridep-num-sms", "--moe-deepep-num-sms"):
        given = flags.take(flag, "SMs the flex dispatcher's kernels take (their published rate at that count)", int)
        if given is not None:
            if given <= 0:
                raise UserError(f"{flag} {given}: give a positive number of SMs")
            sms = sms if sms is not None else given
    if kind != "flex":
        if sms is not None or backend_given:
            raise UserError(f"the flex dispatcher's backend and SMs are given with --moe-token-dispatcher-type "
                            f"{kind}, which does not run them; give flex or drop them")
        job.ep_backend = None
        return
    if backend == "ncclep":
        raise UserError("--moe-flex-dispatcher-backend ncclep (NCCL EP through Transformer Engine) has no "
                        "published rate ckplan reads; score the job with deepep, hybridep or the alltoall dispatcher")
    from planner.models.ep_dispatch_rates import DEFAULT_SMS

    job.ep_backend = (backend, sms if sms is not None else DEFAULT_SMS[backend])


def backend_setup(job, device, gpus_per_node: int | None, notes: list[str]):
    """The setup's EpDispatchSetup for the job's flex backend, or None (with a note) where it is charged as NCCL's
    all-to-all: no backend, no expert parallelism, an EP group past the NVLink domain (the backends' RDMA path is
    not read), or a GPU the backend published no figure for."""
    from planner.models.ep_dispatch_rates import TABLES, ranks_per_token, rates
    from planner.schema.setup import EpDispatchSetup

    backend = getattr(job, "ep_backend", None)
    if backend is None or job.ep <= 1 or not job.arch.num_experts or job.arch.num_experts % job.ep:
        return None  # no expert parallelism (Megatron-core asserts the experts divide over EP)
    name, sms = backend
    node = gpus_per_node or device.gpus_per_node
    if job.ep * job.tp > node:
        notes.append(f"{name}: EP {job.ep} x TP {job.tp} spans past the {node}-GPU NVLink domain; its RDMA path has "
                     "no figure read, so its dispatch is charged as NCCL's all-to-all over the network")
        return None
    found = rates(name, device.name, job.ep, sms)
    if found is None:
        notes.append(f"{name}: no published figure on {device.name}; its dispatch is charged as NCCL's all-to-all "
                     "at the EP link")
        return None
    dispatch, combine, how = found
    copies = ranks_per_token(job.arch.num_experts, job.ep, job.arch.num_experts_per_tok)
    ratio = copies / job.arch.num_experts_per_tok
    notes.append(f"the flex dispatcher on {how}: dispatch {dispatch:g}, combine {combine:g} GB/s of the tokens a rank "
                 f"receives, {copies:.2f} EP ranks a token of its {job.arch.num_experts_per_tok} experts "
                 f"(uniform routing over {job.arch.num_experts} experts); {TABLES[name][1]}")
    return EpDispatchSetup(backend=name, dispatch_gb_per_s=dispatch, combine_gb_per_s=combine,
                           rank_copies=round(ratio, 6), source=how)
