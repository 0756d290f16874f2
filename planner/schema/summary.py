"""One pipeline rank as every `--json` output gives it (`evaluate`, `evaluate --from-megatron` /
`--from-torchtitan`, `solve`, `search`): the one declaration of its keys, which
planner/commands/stage_json.py fills from a stage and its cost. Issue 33: every --json output
carries each rank's static, allocated peak and reserved peak."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from planner.schema.fields import MAX_STAGES, Bytes, Strict
from planner.schema.profile import OptionName


class StageSummary(Strict):
    # the pipeline rank (under a chunked schedule its stages, chunk 0 first, are one entry); the
    # canonical name, as plan.yaml's stages carry it
    index: int = Field(ge=0, le=MAX_STAGES)
    rank: int  # the same as index: evaluate --from-*'s name for it, kept for what parses it
    layers: list[str]
    checkpointed: list[str]  # the layers that recompute their whole forward
    recompute: dict[str, OptionName]  # layer -> recompute option, for every layer whose option is not none
    static_bytes: Bytes  # weights, gradients and optimizer state
    after_step_bytes: Bytes  # allocated after the optimizer step (what Megatron-LM logs as mem-allocated-bytes)
    step_end_bytes: Bytes  # at the step's end beyond static and buffers (planner/cost/chunked.py)
    peak_bytes: Bytes  # the allocated peak
    reserved_bytes: Bytes | None  # cuda: the caching allocator's reserved peak; None on cpu
    reserved_by: Literal["replay", "divisor"] | None  # how reserved_bytes was found (StagePredicted.reserved_by)
    replayed_reserved_bytes: Bytes | None  # null: the replay is the reserve itself where it runs (reserve.py); kept for parsers
    # where the replay ran (planner/cost/capped_reserve.py): "fits" (its reserve without a cap fits), "retried" (torch's
    # release-and-retry keeps it under the cap: reserved_bytes is the capped replay's) or "oom" (a request fails even
    # then: reserved_bytes is the uncapped one); and the uncapped replay's reserved peak
    cap_replay: Literal["fits", "retried", "oom"] | None
    uncapped_reserved_bytes: Bytes | None
    # where FSDP2's replay set reserved_bytes within the cap: the lowest and highest reserved peak of that replay and
    # of it with every request of 512 MiB or more 2 MiB larger, and smaller (planner/cost/reserve_range.py: the
    # caching allocator's mode turns on a few MiB there); null elsewhere, and in evaluate's "ckplan" plan and search's
    # ranks (solve gives its plan's). reserved_bytes stays the replay's own
    reserved_range_bytes: tuple[Bytes, Bytes] | None = None
    workspace_bytes: Bytes  # the communication library's buffers beside the reserve
    nccl_buffers: dict[str, Bytes] = {}  # workspace_bytes' NCCL part by communicator (planner/cost/nccl_buffers.py)
    cap_bytes: Bytes  # the cap: reserved + workspace (cuda), or the peak (cpu) must fit it
    fits: bool  # the device's and the host's verdict (planner/cost/assembly.py StageCost.fits)
    time_ms: float  # per microbatch: forward, backward, recompute
    step_ms: float  # the optimizer step, once per iteration

    @model_validator(mode="after")
    def _rank_is_index(self) -> StageSummary:
        if self.rank != self.index:
            raise ValueError(f"stage {self.index}: rank {self.rank} is not its index")
        return self
