"""The whole-job search: from a model, N GPUs and a global batch to the fastest configurations
that fit, each with the exact plan ckplan solves today.

Every configuration of planner/solve/degrees.py is considered. Profiles are built once per
(tp, sp, micro-batch size, cp, ep) by the caller's `profile_for` (the analytic profiler, or a given
profile) and reused: a MoE model's experts are timed at each configuration's own expert
parallelism. Each configuration's setup gets the proven bounds of bounds.py: one whose
memory bound exceeds the card is pruned without a solve; the rest are solved in the order of
their time bound with today's route (search.plan: the exact DP where its structure holds, the
MILP elsewhere), each bounded by the `top`-th best time found so far, and the search stops
once the next time bound reaches it: no configuration left could enter the ranking. The
ranking is therefore the same as solving every configuration (tests/test_search.py holds it
to that brute force). The one-chunk configurations (1F1B, GPipe: the DP) pass first, then the
chunked ones (the MILP) under the bar they left, an interleaved one pruned before its MILP where its bound
with the bubble (chunkbound.py, asked only then) reaches the bar: every chunk count is solved or pruned so
(docs/published-runs.md §41.chunklp).

Under a time limit the search is a branch and bound interleaved with the enumeration: before each
configuration, while the solves have taken less of the time spent than the enumeration (each gets half: a
policy, no figure fitted), the kept configuration with the best bound not yet solved is solved within that share,
and one whose bound is no better than the `top`-th best found is pruned (planner/solve/searchqueue.py: each solve
is given the bar as its cutoff, and one stopped at its share waits for the enumeration's end). Given the time its ranking is the exhaustive search's; cut short, it says what it solved,
pruned and left unsolved, and the best bound left against the best found. Without a limit the enumeration runs
first (the fewest solves: the bar is set by the best bounds of all).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import ValidationError

from planner.cost import dataparallel, links, nccl_buffers, ub_sms
from planner.models import copy_engines, network_rate
from planner.schema import Profile, TrainSetup
from planner.solve import bounds as bounds_mod
from planner.solve import search, searchqueue
from planner.solve.deadline import Deadline
from planner.solve.degrees import Degrees, JobShape, enumerate_degrees
from planner.solve.searchoutcome import Candidate, Outcome, Solved

# (tp, sp, micro_batch_size) -> profile; called with cp=N as a keyword where a configuration has
# context parallelism N > 1, and ep=E where it has expert parallelism E > 1 (the experts' GEMMs
# timed as an EP rank runs them: formulas.Shape.ep)
ProfileFor = Callable[..., Profile]


@dataclass(frozen=True)
class JobOptions:
    """What every configuration's setup shares."""

    mem_cap_bytes: int  # per GPU
    gpus_per_node: int  # GPUs a host runs (its memory, its processes)
    nvlink_domain: int | None = None  # GPUs the links are placed by (planner/models/topology.py); None: the host's
    optimizer: str = "adam"
    precision: str = "bf16-mixed"
    runtime: str = "ckplan"
    recompute: str = "options"
    # the settings real jobs use, as TrainingSetup's fields (runtime_version, compile, float8, ...;
    # context_parallel is each configuration's own, and cp_comm applies where it is above 1)
    training: dict = field(default_factory=dict)
    tp_overlap: str = "none"  # CommSetup's: the runtime setting that overlaps the TP collectives
    # DataParallelSetup's fields every configuration gets (DeepSpeed's stage3_* and reduce_bucket_size knobs; a
    # framework file's DDP settings where it is scored: commands/search_compare.py)
    data_parallel: dict = field(default_factory=dict)
    # TE's userbuffers config under tp-comm-overlap (planner/cost/ub_sms.py): None, TE's defaults, for the search's
    # own configurations; a framework file's --tp-comm-overlap-cfg (its name, its GEMMs read) where it is scored
    ub_cfg: str | None = None
    ub_gemms: dict | None = None


def job_setup(profile: Profile, degrees: Degrees, options: JobOptions) -> TrainSetup:
    """The TrainSetup of one configuration, as `ckplan solve` would build it for these degrees
    (bandwidths from the profile's GPU and --gpus-per-node; torchtitan's own mapping of ZeRO)."""
    pp, dp = degrees.pp, degrees.dp * degrees.cp  # the cp ranks hold their replica's weights too
    fields = dict(stages=pp, microbatches=degrees.microbatches, micro_batch_size=degrees.micro_batch_size,
                  schedule=degrees.schedule, chunks=degrees.chunks, mem_caps_bytes=[options.mem_cap_bytes] * pp,
                  optimizer=options.optimizer, precision=options.precision, runtime=options.runtime,
                  recompute=options.recompute, dp=dp, zero=degrees.zero, shard_group=degrees.shard_group,
                  ep=degrees.ep, context_parallel=degrees.cp, offload=degrees.offload)
    fields.update(options.training)
    fields.update(options.data_parallel)
    if degrees.offload:  # the host's optimizer step, as the profile times it (setup_options.profile_host_step_ns)
        fields["host_step_ns_per_param"] = profile.host_step_ns_per_param[options.optimizer]
    fields["cp_comm"] = options.training.get("cp_comm") if degrees.cp > 1 else None
    domain = options.nvlink_domain or options.gpus_per_node
    if dp > 1 or degrees.offload:  # evaluate's rule (setup_options): the host's link wherever the optimizer is there
        fields.update(_links(profile, dataclasses.replace(degrees, dp=dp), domain, host=options.gpus_per_node))
    fields.update(_links_of_comm(profile, degrees, domain, host=options.gpus_per_node))
    if degrees.tp > 1:
        fields.update(tp_overlap=options.tp_overlap)
    if degrees.tp > 1 and profile.device.type == "cuda":
        # TE's userbuffers' SMs under tp-comm-overlap (TE's default config: search takes no --tp-comm-overlap-cfg;
        # a compared file's own), as comm_setup.comm_fields sets them for evaluate and solve
        fields.update(ub_sms.setup_fields(dataparallel.profile_gpu(profile), options.tp_overlap,
                                          config=options.ub_cfg, gemms=options.ub_gemms))
    if degrees.tp > 1 and options.tp_overlap == "async-tp" and profile.device.type == "cuda":
        # AsyncTP's peer copies at the copy engines' rate, as comm_setup.comm_fields sets it
        fields.update(copy_engines.tp_copy_fields(dataparallel.profile_gpu(profile).name, tp=degrees.tp,
                                                  gpus_per_node=domain)[0])
    setup = TrainSetup(**fields)
    if options.runtime == "torchtitan":
        setup = dataparallel.as_torchtitan_runs(setup)
    return setup


def _links(profile: Profile, degrees: Degrees, gpus_per_node: int, *, host: int) -> dict:
    """links.default_links' rule with the job's NVLink domain (`gpus_per_node`; `host`: the ranks sharing a host's
    memory): a group whose ranks x tp fit
    in a node reduces at the node's collective rate (measured busbw, else the link's), a wider one over
    the network at the bus bandwidth of its ranks' NICs in each node (planner/models/network_rate.py); an expert
    all-to-all in a node at NCCL's NVLink rate (GPU.node_alltoall_rate), across nodes over its ranks' own NICs."""
    if profile.device.type != "cuda":
        chosen = links.default_links(profile, stages=degrees.pp, dp=degrees.dp,
                                     shard_group=degrees.shard_group or degrees.dp, ep=degrees.ep)
        return dict(shard_gb_per_s=chosen.shard_gb_per_s, replica_gb_per_s=chosen.replica_gb_per_s,
                    host_gb_per_s=chosen.host_gb_per_s, devices_per_node=chosen.devices_per_node,
                    ep_gb_per_s=chosen.ep_gb_per_s, dp_notes=chosen.notes)
    gpu = dataparallel.profile_gpu(profile)

    shards = degrees.shard_group or degrees.dp  # the replicas: dp / shards ranks, shards x tp apart
    experts = network_rate.alltoall_rate(gpu, degrees.ep, degrees.tp, gpus_per_node)
    return dict(shard_gb_per_s=network_rate.collective_rate(gpu, shards, degrees.tp, gpus_per_node),
                replica_gb_per_s=network_rate.collective_rate(gpu, max(1, degrees.dp // shards), degrees.tp * shards,
                                                              gpus_per_node),
                # shared per switch uplink as links.default_links shares it for evaluate (§43.dsgap)
                host_gb_per_s=gpu.host_link_gb_per_s / links.host_sharing(
                    gpu, host, degrees.pp * degrees.dp * degrees.tp), devices_per_node=host,
                **nccl_buffers.gpu_fields(profile, gpu),
                ep_gb_per_s=experts if degrees.ep > 1 else None,
                dp_notes=[f"{gpu.name}, {gpus_per_node} GPUs a node, tp {degrees.tp}: groups within a node at "
                          f"{gpu.node_collective_rate:g} GB/s, across nodes at {gpu.network_collective_rate:g} GB/s "
                          "a NIC of their ranks in each node (planner/models/network_rate.py); "
                          f"{gpu.link_source}"])


def _links_of_comm(profile: Profile, degrees: Degrees, gpus_per_node: int, *, host: int) -> dict:
    """The tensor-parallel, context-parallel and pipeline links of one configuration, chosen by the
    rule `ckplan solve`'s comm_setup.comm_fields applies (comm.job_links) with the job's node size;
    nothing on cpu."""
    from planner.cost import comm

    if profile.device.type != "cuda" or (degrees.tp == 1 and degrees.pp == 1 and degrees.cp == 1):
        return {}
    gpu = dataparallel.profile_gpu(profile)
    links = comm.job_links(gpu, tp=degrees.tp, cp=degrees.cp, pp_stride=degrees.tp * degrees.dp * degrees.cp,
                           gpus_per_node=gpus_per_node, nics_per_gpu=gpu.nics_per_gpu)
    found: dict = {"gpus_per_node": host, "nvlink_domain": gpus_per_node}
    if degrees.tp > 1 or degrees.cp > 1:
        found.update(collective_latency_ms=links["tp" if degrees.tp > 1 else "cp"].base_latency_ms,
                     node_step_latency_ms=links["node"].step_latency_ms)
    if degrees.tp > 1:
        found.update(tp=degrees.tp, tp_gb_per_s=links["tp"].gb_per_s, tp_step_latency_ms=links["tp"].step_latency_ms)
    if degrees.cp > 1:
        found.update(cp=degrees.cp, cp_gb_per_s=links["cp"].gb_per_s, cp_step_latency_ms=links["cp"].step_latency_ms)
    if degrees.pp > 1:
        node, network = links["node"], links["network"]  # each send over its own edge's (comm.edge_crosses_nodes)
        found.update(pp_gb_per_s=node.gb_per_s, pp_latency_ms=node.base_latency_ms + node.step_latency_ms,
                     pp_stride=degrees.tp * degrees.dp * degrees.cp, pp_network_gb_per_s=network.gb_per_s,
                     pp_network_latency_ms=network.base_latency_ms + network.step_latency_ms)
    return found


def _a2a_splits_heads(profile: Profile, degrees: Degrees, options: JobOptions) -> bool:
    """Under cp_comm a2a each rank's Q and K/V heads split over the cp ranks: Transformer Engine
    asserts that cp divides them (context_parallel.py 4246-4248, d0067d0d); True where it does or
    the setting does not apply."""
    model = profile.assumptions.get("model")
    if options.training.get("cp_comm") != "a2a" or degrees.cp == 1 or not isinstance(model, dict):
        return True
    heads, kv = model.get("num_heads", 0) // degrees.tp, max(model.get("num_kv_heads", 0) // degrees.tp, 1)
    return heads % degrees.cp == 0 and kv % degrees.cp == 0


class Profiles:
    """Profiles per (tp, sp, micro-batch size, cp, ep), built once, with their distinct layers."""

    def __init__(self, profile_for: ProfileFor):
        self._profile_for = profile_for
        self._cache: dict[tuple[int, bool, int, int, int], tuple[Profile, list]] = {}
        self._float8: dict[tuple[int, int], tuple[Profile, list]] = {}
        self._runtime: dict[tuple[int, str], Profile] = {}  # float8.runtime_profile's, by profile and settings

    def get(self, tp: int, sp: bool, mbs: int, cp: int = 1, ep: int = 1) -> tuple[Profile, list]:
        key = (tp, sp, mbs, cp, ep)
        if key not in self._cache:
            keywords = ({"cp": cp} if cp > 1 else {}) | ({"ep": ep} if ep > 1 else {})
            profile = self._profile_for(tp, sp, mbs, **keywords)
            self._cache[key] = (profile, bounds_mod.kinds(profile))
        return self._cache[key]

    def built(self, tp: int, sp: bool, mbs: int, cp: int = 1, ep: int = 1) -> bool:
        return (tp, sp, mbs, cp, ep) in self._cache

    def for_setup(self, profile: Profile, layers: list, setup: TrainSetup) -> tuple[Profile, list]:
        """(profile, layers) as `setup` charges them, float8.float8_profile's as evaluate applies it: under
        Float8 its records (they depend on the setup through its shard group's size: the float8 all-gather
        where FSDP shards, Transformer Engine's once-a-step weight cast times the group), the runtime's
        fused kernels, its fused SwiGLU's and MoE layers' tensors, the chunked loss; the part that reads the
        training settings alone once per profile and settings (float8.runtime_profile: B4's 126 blocks' records
        copied once, not once a shard group), the Float8 records once per profile and shard group (every other
        input is a setting all the configurations share)."""
        from planner.cost.float8 import float8_applied, runtime_profile, te_primary_weights

        training = setup.training  # one runtime a search; keyed all the same, as a Profiles may serve two
        key = (id(profile), training.runtime, training.runtime_version,
               dataparallel.shard_size(setup) if training.float8 else 0,
               te_primary_weights(setup))  # TE's FP8 weights cast from the master shard: ZeRO 1 only
        if key not in self._float8:
            settings = (id(profile), training.model_dump_json())
            if settings not in self._runtime:
                self._runtime[settings] = runtime_profile(profile, setup)
            applied = float8_applied(self._runtime[settings], setup)
            self._float8[key] = (applied, bounds_mod.kinds(applied))
        return self._float8[key]

    def __len__(self) -> int:
        return len(self._cache)


def candidates(job: JobShape, options: JobOptions, profiles: Profiles, outcome: Outcome,
               deadline: Deadline | None = None, midway: Callable[[list[Candidate]], None] | None = None
               ) -> list[Candidate]:
    """Every configuration that passes the memory bound, with its bounds, counted in `outcome`. Past
    `deadline`, looked at before each configuration (a bound costs ~30 ms at 16 GPUs and up, once its profile is
    built: §42.profspeed), the enumeration stops there: those kept so far, the rest counted in
    outcome.unexplored (outcome.complete False). `midway(kept)` is called before each configuration
    (search_job's solves in bound order under a limit)."""
    kept, seen = [], set()
    every = enumerate_degrees(job)

    def stopped(index: int, *key) -> bool:
        if deadline is None or not deadline.expired():
            return False
        outcome.complete, outcome.unexplored = False, len(every) - index
        return True

    for index, degrees in enumerate(every):
        if midway is not None:
            midway(kept)
        # the memory bound from the profile at ep 1 (a given analytic profile: its own ep): an EP profile differs
        # from it in times only (formulas.Shape.ep), so it is built only for a configuration that passes
        # (tests/test_search_ep.py holds the bounds equal)
        first_ep = degrees.ep if job.ep_ok is not None else 1
        if stopped(index, degrees.tp, degrees.sp, degrees.micro_batch_size, degrees.cp, first_ep):
            break
        outcome.considered += 1
        written, layers = profiles.get(degrees.tp, degrees.sp, degrees.micro_batch_size, degrees.cp, first_ep)
        try:
            setup = job_setup(written, degrees, options)
        except ValidationError:
            outcome.refused += 1
            continue
        if not _a2a_splits_heads(written, degrees, options):
            outcome.refused += 1
            continue
        if _runtime_refuses(setup, written.tied):
            outcome.refused += 1
            continue
        profile, layers = profiles.for_setup(written, layers, setup)
        # the degrees as the runtime runs them (torchtitan: every ZeRO stage as FSDP2's ZeRO 3)
        degrees = dataclasses.replace(degrees, zero=setup.data_parallel.zero,
                                      shard_group=setup.data_parallel.shard_group)
        key = (degrees.tp, degrees.sp, degrees.micro_batch_size, degrees.cp,
               setup.model_dump_json(exclude={"data_parallel": {"dp_notes"}}))
        if key in seen:
            outcome.duplicates += 1
            continue
        seen.add(key)
        # where its own EP's profile bounds its time below, the EP-1 profile's memory bound alone (§43.searchfast)
        candidate = Candidate(degrees, setup, profile, bounds_mod.setup_bounds(profile, setup, layers,
                                                                               timed=degrees.ep == first_ep),
                              plan_profile=written if profile is not written else None)
        if candidate.bounds.memory_excess_bytes > 0:
            outcome.pruned_memory += 1
            if outcome.nearest is None or _ratio(candidate) < _ratio(outcome.nearest):
                outcome.nearest = candidate
            continue
        if degrees.ep != first_ep:  # its experts timed at its own expert parallelism
            if stopped(index, degrees.tp, degrees.sp, degrees.micro_batch_size, degrees.cp, degrees.ep):
                outcome.considered -= 1  # counted unexplored
                break
            written, layers = profiles.get(degrees.tp, degrees.sp, degrees.micro_batch_size, degrees.cp, degrees.ep)
            profile, layers = profiles.for_setup(written, layers, setup)
            candidate = Candidate(degrees, setup, profile, bounds_mod.setup_bounds(profile, setup, layers),
                                  plan_profile=written if profile is not written else None)
        kept.append(candidate)
    outcome.profiles = len(profiles)
    return kept


def _runtime_refuses(setup: TrainSetup, tied: list) -> bool:
    """The framework cannot run this ZeRO stage here (runnable.data_parallel_refused: DeepSpeed's pipeline
    engine past ZeRO 1, its shard groups; microbatches on one stage where the runtime accumulates none), or
    these tied weights beside this pipeline (runnable.tied_refused: torchtitan's untied copies), as `ckplan
    solve` would refuse it."""
    from planner.cost import runnable

    training, data_parallel, pipeline = setup.training, setup.data_parallel, setup.pipeline
    return bool(runnable.data_parallel_refused(
        training.runtime, training.runtime_version, precision=training.precision, zero=data_parallel.zero,
        dp=data_parallel.dp, shard_group=data_parallel.shard_group, stages=pipeline.stages)
        or runnable.accumulation_refused(training.runtime, training.runtime_version, stages=pipeline.stages,
                                         microbatches=pipeline.microbatches)
        or runnable.tied_refused(training.runtime, training.runtime_version, stages=pipeline.stages, tied=tied))


def _ratio(candidate: Candidate) -> float:
    return candidate.bounds.static_bytes / max(1, candidate.bounds.limit_bytes)


def search_job(job: JobShape, options: JobOptions, profile_for: ProfileFor, *, top: int = 5,
               deadline: Deadline | None = None, solver: str = "auto") -> Outcome:
    """The `top` fastest configurations that fit, each with its exact plan (see the module's text).
    Past `deadline` the search stops where it is, building profiles or solving (outcome.complete False:
    the ranking is the best of what was solved; outcome.unexplored the configurations never reached,
    outcome.unsolved those bounded below the bar and not solved); under a limit the kept configurations are
    solved in bound order while the enumeration runs (outcome.solved_early of them).
    Every chunked configuration the bounds do not prune is solved (chunkbound.py's bound charges the sends and
    reductions: the interleaved ones cost 1.8 s of LPs on an 8B job, docs/published-runs.md §41.chunklp)."""
    started = time.perf_counter()
    deadline = deadline or Deadline(None)
    outcome = Outcome()
    queue = searchqueue.Queue(outcome, top=top, deadline=deadline, solver=solver,
                              solve=lambda candidate, **keywords: solve_one(candidate, **keywords))
    found = candidates(job, options, Profiles(profile_for), outcome, deadline,
                       queue.between if deadline.limit_s is not None else None)
    queue.push(found)
    queue.drain()
    outcome.wall_s = time.perf_counter() - started
    return outcome


def solve_one(candidate: Candidate, *, upper_bound_ms: float | None, deadline: Deadline,
              solver: str = "auto") -> Solved | search.NoFit | None:
    """Today's exact plan of one configuration no slower than `upper_bound_ms`, or None (none is); the
    NoFit "timeout" where `deadline` stopped it before any plan (that proves nothing). The baselines are not
    scored first for a starting bound (on 405B they took longer than the DP itself): the search's own cutoff
    (searchqueue.py), the top-th best so far, is the DP's."""
    result = search.plan(candidate.profile, candidate.setup, solver=solver, upper_bound_ms=upper_bound_ms,
                         deadline=Deadline(deadline.remaining_s(), clock=deadline.clock), baselines_scored=True)
    if isinstance(result, search.NoFit):
        return result if result.status == "timeout" else None
    return Solved(candidate, result.stages, result.cost, result.solve)


def memory_passing(job: JobShape, options: JobOptions, profile_for: ProfileFor) -> int:
    """How many configurations of `job` pass the memory bound (no solve): what the nothing-fits
    explanation reports for more GPUs."""
    outcome = Outcome()
    return len(candidates(job, options, Profiles(profile_for), outcome))
