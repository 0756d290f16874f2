"""The plan: each stage's layers and recompute options, what the cost model predicts, the solver's
result and the baselines."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from planner.schema.fields import (
    MAX_STAGES,
    Bytes,
    Dtype,
    FileRef,
    Strict,
)
from planner.schema.profile import OPTION_FULL, OPTION_NONE, DeviceInfo, OptionName
from planner.schema.setup import TrainSetup

# plans: 2 gives the setup in parts (TrainSetup); version 1 plans, with the setup flat, load
# as they are (TrainSetup nests their fields). 3 names the attention core `core-attn`: a version 1 or 2
# plan made from an analytic profile loads with its `attn` read as `core-attn` (planner/schema/renames.py)
PLAN_SCHEMA_VERSION = 3
PLAN_SCHEMA_VERSIONS = (1, 2, 3)
PLAN_CORE_ATTN_VERSION = 3  # the first plan version whose analytic `attn` is the whole attention module


class StagePredicted(Strict):
    peak_bytes: Bytes
    static_bytes: Bytes  # weights + grads + optimizer state
    # allocated after the optimizer step: static + what the runtime keeps past it (None: plans
    # written before it was predicted)
    after_step_bytes: Bytes | None = None
    activation_bytes: Bytes  # in-flight microbatches x kept bytes per microbatch
    buffer_bytes: Bytes = 0  # pipeline send/recv buffers
    transient_bytes: Bytes = 0  # recompute + largest layer transient
    # what static counts that the stage does not hold at its peak, net of the largest transient: beside a pipeline
    # under FSDP2's moments, the gradient shards the step set to None and no backward has made again
    # (gathered.stage_floor); static + buffers + activations + transient - freed is the peak's moment
    freed_bytes: Bytes = 0
    time_ms: float  # fwd + bwd + recompute for all microbatches' worth of one microbatch
    step_ms: float = 0.0  # optimizer step, once per iteration
    comm_ms: float = 0.0  # per microbatch: the stage's sends and schedule actions (not in time_ms)
    # cuda: what the caching allocator reserves at the peak, and the communication library's
    # buffers beside it (planner/cost/allocator.py); the cap holds both. None / 0 on cpu
    reserved_bytes: int | None = None
    # how reserved_bytes was found: "replay" (the caching allocator's rules over the stage's
    # recorded allocations, planner/cost/reserve.py) or "divisor" (the allocated peak over
    # 1 - fragmentation: profiles without allocation records, chunked schedules, --fragmentation)
    reserved_by: Literal["replay", "divisor"] | None = None
    # cuda, where the replay of the runtime's step ran and the divisor's reserve is the larger (torchtitan's
    # FSDP2 step, planner/cost/reserve_fsdp2.py): the replay's reserved peak, reported beside it
    replayed_reserved_bytes: int | None = None
    workspace_bytes: int = 0
    # host memory the rank takes (offloaded optimizer, offloaded activations) and its share of
    # the node's (--host-mem; None: not capped)
    host_bytes: int = 0
    host_cap_bytes: int | None = None


class StagePlan(Strict):
    index: int = Field(ge=0, le=MAX_STAGES)
    layers: list[str] = Field(min_length=1)
    checkpointed: list[str] = []  # the layers whose option is "full" (recompute their whole forward)
    # layer -> its recompute option, for every layer whose option is not "none"; written from
    # `checkpointed` when only that is given (plans made before options)
    recompute: dict[str, OptionName] = {}
    # chunked schedules: the rank's layer ranges, chunk 0 first (their concatenation is `layers`)
    chunks: list[list[str]] = []
    predicted: StagePredicted | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_from_the_other(cls, data):
        if isinstance(data, dict):
            recompute, checkpointed = data.get("recompute"), data.get("checkpointed")
            if not recompute and checkpointed:
                data = {**data, "recompute": dict.fromkeys(checkpointed, OPTION_FULL)}
            elif recompute and checkpointed is None and isinstance(recompute, dict):
                data = {**data, "checkpointed": [name for name in data.get("layers", [])
                                                 if recompute.get(name) == OPTION_FULL]}
        return data

    @model_validator(mode="after")
    def _checkpointed_subset(self) -> StagePlan:
        owned = set(self.layers)
        stray = [name for name in [*self.checkpointed, *self.recompute] if name not in owned]
        if stray:
            raise ValueError(f"stage {self.index} recomputes layers it does not own: {stray}")
        full = [name for name in self.layers if self.recompute.get(name) == OPTION_FULL]
        if sorted(full) != sorted(self.checkpointed):
            raise ValueError(f"stage {self.index}: checkpointed {self.checkpointed} are not the layers whose "
                             f"recompute option is full ({full})")
        if any(option == OPTION_NONE for option in self.recompute.values()):
            raise ValueError(f"stage {self.index}: recompute lists only layers whose option is not none")
        if self.chunks and ([name for chunk in self.chunks for name in chunk] != self.layers
                            or not all(self.chunks)):
            raise ValueError(f"stage {self.index}: its chunks are not its layers in order, each non-empty")
        return self

    def option(self, layer: str) -> str:
        """The layer's recompute option: `checkpointed` says which are full (a copy that
        updated it alone stays right), `recompute` the selective ones."""
        if layer in self.checkpointed:
            return OPTION_FULL
        option = self.recompute.get(layer, OPTION_NONE)
        return OPTION_NONE if option == OPTION_FULL else option

    def with_recompute(self, recompute: dict[str, str]) -> StagePlan:
        """A validated copy whose layers recompute as `recompute` says (layer -> option; the
        others "none"), its prediction dropped."""
        chosen = {name: option for name, option in recompute.items() if option != OPTION_NONE}
        return StagePlan(index=self.index, layers=list(self.layers), recompute=chosen,
                         checkpointed=[name for name in self.layers if chosen.get(name) == OPTION_FULL],
                         chunks=[list(chunk) for chunk in self.chunks])

    def with_checkpointed(self, names) -> StagePlan:
        """A validated copy that checkpoints whole layers `names` and recomputes nothing else."""
        return self.with_recompute(dict.fromkeys(names, OPTION_FULL))


class PlanPredicted(Strict):
    iteration_ms: float
    peak_bytes_max: int = 0


class SolverInfo(Strict):
    # the solver that ran: "dp" (planner/dpsolve.py) or "milp" (HiGHS); "highs" in plans written
    # before the search picked between them (the DP ran then, HiGHS only in tests)
    name: str = "dp"
    status: Literal["optimal", "feasible", "infeasible"]
    objective: float | None = None  # predicted iteration ms
    bound: float | None = None  # proven lower bound on the iteration ms
    gap: float | None = None  # relative gap between objective and bound at the end
    wall_s: float = 0.0
    # where the caching allocator's replay judges the plan (planner/solve/replayfit.py): "relaxed", solved under
    # rows that admit every plan the replay admits, the status holding against the replay; "searched", found by
    # the search over caps below them, its bound the relaxed solve's (or the last cut solve's); "cut", the DP under
    # those rows with each set the replay put over excluded until its plan fit (planner/solve/replaycuts.py), the
    # status holding against the replay over the sets the DP weighs; None: the solvers' rows are the verdict
    replay: Literal["relaxed", "searched", "cut"] | None = None
    solves: int = 1  # the solves that took
    # the search over caps cut by --time-limit: at most this many of its solves unmade, each about round_s seconds
    rounds_left: int = 0
    round_s: float = 0.0
    timed_out: bool = False  # --time-limit stopped a solver before it finished: the best plan it had then


class BaselineResult(Strict):
    """A reference strategy scored by the same cost model; its stages make it runnable."""

    name: str
    feasible: bool
    iteration_ms: float
    peak_bytes_per_stage: list[int]
    stages: list[StagePlan] = []


class Plan(Strict):
    schema_version: int = PLAN_SCHEMA_VERSION
    created_at: str
    model: FileRef  # launch refuses a plan whose model file changed
    profile: FileRef
    device: DeviceInfo  # where the profile was measured; the runtime reproduces its threads
    dtype: Dtype  # the profile's dtype
    profile_source: Literal["measured", "analytic", "fake"] = "measured"  # an analytic plan is exported, not launched
    setup: TrainSetup
    stages: list[StagePlan] = Field(min_length=1)
    predicted: PlanPredicted
    solver: SolverInfo
    baselines: list[BaselineResult] = []

    @model_validator(mode="after")
    def _stages_match_setup(self) -> Plan:
        if len(self.stages) != self.setup.pipeline.stages:
            raise ValueError(f"plan has {len(self.stages)} stages but setup.pipeline.stages is {self.setup.pipeline.stages}")
        if [stage.index for stage in self.stages] != list(range(len(self.stages))):
            raise ValueError("stage indices must be 0, 1, 2, ... in order")
        return self
