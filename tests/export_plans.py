"""Plans for the export tests: a small LLM-shaped profile and hand-made plans on it,
written to disk the way `ckplan solve` writes them."""

from __future__ import annotations

from planner import io
from planner.cost import costmodel
from planner.models import synthetic
from planner.schema import (
    FileRef,
    Plan,
    PlanPredicted,
    RecomputeOption,
    SolverInfo,
    StagePlan,
    TrainSetup,
)

MIB = 2**20


# A decoder block's selective options (kept MiB, recompute ms) beside none (10 MiB) and full (1 MiB,
# a 10 ms forward): core-attn the attention core, mlp-act the MLP's activation, as the analytic profiles
# offer them (planner/profiler/analytic.py), attn the attention module whole, and the module-level ones a
# measured profile has.
BLOCK_OPTIONS = {"core-attn": (7, 1.0), "attn": (6.5, 1.8), "mlp": (6, 4.0), "mlp-act": (8, 0.5),
                 "norm": (9.5, 0.2), "save-matmuls": (5, 3.0), "core-attn,mlp-act": (5, 1.5)}


def llm_profile(num_blocks: int = 8, *, options: bool = False, kind: str = "Block"):
    """Embedding, identical decoder blocks (10 MiB kept, 1 MiB input each), norm+head; with
    `options`, the blocks' selective recompute options BLOCK_OPTIONS."""
    layers = [synthetic.layer("tok_embeddings", "Embedding", fwd_ms=0.5, act_mib=0.01, input_mib=0.01,
                              output_mib=1, param_count=100_000)]
    block = [synthetic.layer(f"layers.{i}", kind, fwd_ms=10, act_mib=10, input_mib=1, param_count=200_000)
             for i in range(num_blocks)]
    if options:
        table = [RecomputeOption(name="none", kept_bytes=10 * MIB), RecomputeOption(name="full", kept_bytes=MIB)]
        table += [RecomputeOption(name=name, kept_bytes=int(mib * MIB), recompute_ms=ms)
                  for name, (mib, ms) in BLOCK_OPTIONS.items()]
        block = [layer.model_copy(update={"recompute_options": table}) for layer in block]
    layers += block
    layers += [synthetic.layer("output", "Head", fwd_ms=4, act_mib=3, input_mib=1, output_mib=2,
                               param_count=100_000)]
    return synthetic.profile_of(layers, name="llm")


def make_plan(profile, profile_path, sizes: list[int], checkpointed: set[str], *, cap_mib: float = 1000,
              microbatches: int = 6, schedule: str = "1F1B", runtime: str = "ckplan",
              precision: str = "bf16-mixed", **settings) -> Plan:
    """Stages of `sizes` layers (all layers counted), the named layers checkpointed, scored for
    `runtime` (a plan exported to a framework exactly is one solved for its runtime)."""
    bounds = [sum(sizes[:s]) for s in range(len(sizes))]
    flags = [layer.name in checkpointed for layer in profile.layers]
    stages = costmodel.split_to_stages(bounds, flags, profile)
    setup = TrainSetup(stages=len(sizes), microbatches=microbatches, micro_batch_size=1, schedule=schedule,
                       mem_caps_bytes=[int(cap_mib * MIB)] * len(sizes), precision=precision, runtime=runtime,
                       **settings)
    cost = costmodel.evaluate(stages, profile, setup)
    return Plan(created_at="1970-01-01T00:00:00Z", model=FileRef(file="m.py", sha256="0" * 64),
                profile=io.file_ref(profile_path), device=profile.device, dtype=profile.dtype, setup=setup,
                stages=costmodel.with_predictions(stages, cost),
                predicted=PlanPredicted(iteration_ms=cost.iteration_ms, peak_bytes_max=max(cost.peak_bytes_per_stage)),
                solver=SolverInfo(status="optimal", objective=cost.iteration_ms))


def write(tmp_path, sizes, checkpointed, **kwargs):
    """(profile, plan, plan path) on disk."""
    profile = llm_profile()
    profile_path = tmp_path / "llm.json"
    io.save_profile(profile, profile_path)
    plan = make_plan(profile, profile_path, sizes, checkpointed, **kwargs)
    plan_path = tmp_path / "plan.yaml"
    io.save_plan(plan, plan_path)
    return profile, plan, plan_path


def make_chunked_plan(profile, profile_path, sizes: list[int], recompute: dict[str, str], *, schedule: str,
                      chunks: int = 2, microbatches: int = 4, cap_mib: float = 1000,
                      profile_source: str = "measured", runtime: str = "ckplan", **settings) -> Plan:
    """A plan of P·V pipeline stages of `sizes` layers (pipeline order, all layers counted) on
    len(sizes) // chunks ranks as `schedule` places them, layers recomputing as `recompute` says;
    `settings`: the setup's other fields (TrainSetup's flat names)."""
    num_ranks = len(sizes) // chunks
    bounds = [sum(sizes[:s]) for s in range(len(sizes))]
    stages = [StagePlan(index=k, layers=s.layers, recompute={n: recompute[n] for n in s.layers if n in recompute})
              for k, s in enumerate(costmodel.split_to_stages(bounds, [0] * len(profile.layers), profile))]
    setup = TrainSetup(stages=num_ranks, microbatches=microbatches, micro_batch_size=1, schedule=schedule,
                       chunks=chunks, mem_caps_bytes=[int(cap_mib * MIB)] * num_ranks, precision="bf16-mixed",
                       runtime=runtime, **settings)
    ranks = costmodel.ranks_of(stages, setup)
    cost = costmodel.evaluate(ranks, profile, setup)
    return Plan(created_at="1970-01-01T00:00:00Z", model=FileRef(file="m.py", sha256="0" * 64),
                profile=io.file_ref(profile_path), device=profile.device, dtype=profile.dtype, setup=setup,
                stages=costmodel.with_predictions(ranks, cost), profile_source=profile_source,
                predicted=PlanPredicted(iteration_ms=cost.iteration_ms, peak_bytes_max=max(cost.peak_bytes_per_stage)),
                solver=SolverInfo(status="optimal", objective=cost.iteration_ms))


def write_chunked(tmp_path, sizes, recompute, *, profile=None, **kwargs):
    """(profile, plan, plan path) on disk, for a plan of a chunked schedule."""
    profile = profile or llm_profile()
    profile_path = tmp_path / "llm.json"
    io.save_profile(profile, profile_path)
    plan = make_chunked_plan(profile, profile_path, sizes, recompute, **kwargs)
    plan_path = tmp_path / "plan.yaml"
    io.save_plan(plan, plan_path)
    return profile, plan, plan_path
