"""The communication part of the training setup (CommSetup): the links the tensor-parallel
collectives and the pipeline's sends cross, from the profile's GPU and the topology options
(`--gpus-per-node`, `--nvlink-domain`, `--nics-per-gpu`, `--tp-overlap`)."""

from __future__ import annotations

from planner.errors import UserError


def _userbuffers(gpu, options) -> dict:
    """Under --tp-overlap tp-comm-overlap: the userbuffers config and the GPU's SMs (planner/cost/ub_sms.py)."""
    from planner.cost import ub_sms

    if options.ub_cfg is not None and options.tp_overlap != "tp-comm-overlap":
        raise UserError(f"--tp-comm-overlap-cfg {options.ub_cfg} configures TE's userbuffers, which run only under "
                        "--tp-comm-overlap; give it or drop the config")
    gemms = getattr(options, "ub_gemms", None)  # a file's, read by planner/models/configs/ub_cfg.py
    if options.ub_cfg is not None and gemms is None and options.ub_cfg not in ub_sms.CONFIGS:
        raise UserError(f"--tp-comm-overlap-cfg {options.ub_cfg} is neither a YAML file nor one of Megatron-Bridge "
                        f"00b7660b's userbuffers configs ({', '.join(ub_sms.CONFIGS)}); give the file or a name")
    return ub_sms.setup_fields(gpu, options.tp_overlap, config=options.ub_cfg, gemms=gemms)


def comm_fields(profile, options, *, runtime: str, say=None, stages: int = 1, chunks: int = 1) -> dict:
    """TrainSetup's communication part: the tensor-parallel group's and the pipeline's links from
    the profile's GPU and the node size (planner/cost/comm.py), said, with the edges between the pipeline's
    `stages` ranks (and, `chunks` a rank, from the last to the first) whose sends cross nodes; nothing on cpu,
    or for a GPU ckplan has no links for."""
    from planner.cost import comm, dataparallel, runtimes
    from planner.models import copy_engines, topology

    tp = int(profile.assumptions.get("tp", 1) or 1)
    if options.tp_overlap != "none" and runtimes.facts(runtime).tp_overlap != options.tp_overlap:
        owners = ", ".join(r for r in runtimes.VERSIONS if runtimes.facts(r).tp_overlap == options.tp_overlap)
        raise UserError(f"--tp-overlap {options.tp_overlap} is a setting of {owners}'s runtime, and the plan is scored "
                        f"for {runtime}'s; drop --tp-overlap or choose --runtime {owners}")
    if options.tp_overlap != "none" and tp == 1:
        raise UserError(f"--tp-overlap {options.tp_overlap} overlaps tensor-parallel collectives, and the profile was "
                        "made without tensor parallelism (--tp 1); drop it or profile with --tp N")
    if options.tp_overlap == "async-tp" and not (options.settings is not None and options.settings.compile_model):
        raise UserError("--tp-overlap async-tp is torch.compile's micro-pipeline TP pass, which runs only on compiled "
                        "blocks (torchtitan 9dec370 parallelize_llama.py 55-58 raises 'Async TP requires "
                        "--training.compile'): give --compile too (in a torchtitan config, compile.enable)")
    if profile.device.type != "cuda":
        if getattr(options, "nvlink_domain", None) is not None:
            raise UserError(f"--nvlink-domain places collectives on GPUs' NVLink, and the profile runs on "
                            f"{profile.device.type}; drop it or profile for a GPU")
        return {}
    try:
        gpu = dataparallel.profile_gpu(profile)
    except UserError:
        if say is not None:
            say(f"no links known for {profile.device.name}: tensor-parallel collectives and pipeline sends not charged")
        return {}
    host = topology.host_gpus(gpu, options.gpus_per_node)  # the links by the NVLink domain, not the host
    node = topology.nvlink_domain(gpu, options.gpus_per_node, options.nvlink_domain)
    cp = int(profile.assumptions.get("cp", 1) or 1)
    stride = tp * options.dp  # options.dp counts the cp ranks
    links = comm.job_links(gpu, tp=tp, cp=cp, pp_stride=stride,
                           gpus_per_node=node, nics_per_gpu=options.nics_per_gpu or gpu.nics_per_gpu)
    tp_link, cp_link = links["tp"], links["cp"]
    pp_link, network = links["node"], links["network"]  # each send over its own edge's (comm.edge_crosses_nodes)
    edges = [(r, r + 1) for r in range(stages - 1)] + ([(stages - 1, 0)] if chunks > 1 and stages > 1 else [])
    crossing = [f"{r}→{to}" for r, to in edges if comm.edge_crosses_nodes(r, to, stride=stride, gpus_per_node=node)]
    # the links the job's sends take: none without a pipeline; the network only where an edge crosses nodes
    sends = ("no pipeline sends (one stage)" if stages == 1 else
             f"pipeline sends at {pp_link.gb_per_s:g} GB/s ({pp_link.where})" + (
                 f" where both ranks share a node, at {network.gb_per_s:g} GB/s ({network.where}) where they lie in two "
                 f"(pipeline ranks {', '.join(crossing)}, ranks placed tp, cp, dp, pp)" if crossing else ""))
    where = f"{node} GPUs a node" if host == node else f"{node} GPUs an NVLink domain, {host} a host"
    note = (f"{gpu.name}, {where}, {options.nics_per_gpu or gpu.nics_per_gpu:g} NIC(s) a GPU: "
            + sends
            + (f", tensor-parallel {tp} collectives at {tp_link.gb_per_s:g} GB/s ({tp_link.where})" if tp > 1 else "")
            + (f", context-parallel {cp} K/V exchange at {cp_link.gb_per_s:g} GB/s ({cp_link.where})" if cp > 1 else "")
            + f"; latency {comm.NCCL_SOURCE}")
    if tp > 1 and not any(layer.collectives for layer in profile.layers):
        note += (f"; this profile lists no tensor-parallel collectives (a {profile.source} profile, or one made "
                 "before they were recorded): not charged")
    listed = [c for layer in profile.layers for c in layer.collectives]
    copies, said = ({}, "") if options.tp_overlap != "async-tp" else \
        copy_engines.tp_copy_fields(gpu.name, tp=tp, gpus_per_node=node)
    if options.tp_overlap == "async-tp" and listed:  # what torch's micro-pipeline TP pass fuses (planner/cost/asynctp.py)
        fused = sum(c.fused is not None for c in listed)
        note += (f"; AsyncTP overlaps {fused} of the profile's {len(listed)} collectives, those torch fuses with "
                 "matmuls, as their chunked pipeline; the rest charged whole; where the runtime's record says so, its "
                 "symmetric-memory workspace (outside the caching allocator, planner/cost/asynctp.py) is in the nccl "
                 f"column; {said}" if fused else
                 "; AsyncTP: this profile names no collective torch fuses with a matmul (made without --sp, or "
                 "before they were recorded): every one charged whole")
    if say is not None:
        say(note)
    return dict(tp=tp, tp_gb_per_s=tp_link.gb_per_s, tp_step_latency_ms=tp_link.step_latency_ms,
                pp_gb_per_s=pp_link.gb_per_s, pp_latency_ms=pp_link.base_latency_ms + pp_link.step_latency_ms,
                pp_stride=stride, pp_network_gb_per_s=network.gb_per_s,
                pp_network_latency_ms=network.base_latency_ms + network.step_latency_ms,
                collective_latency_ms=tp_link.base_latency_ms, node_step_latency_ms=pp_link.step_latency_ms,
                gpus_per_node=host, nvlink_domain=node,
                tp_overlap=options.tp_overlap, **_userbuffers(gpu, options),
                cp=cp, cp_gb_per_s=cp_link.gb_per_s if cp > 1 else None, cp_step_latency_ms=cp_link.step_latency_ms,
                comm_notes=[note], **copies)
