"""Run a plan: split the model by the plan's layer names, checkpoint the planned layers,
train with torch.distributed.pipelining, measure peak memory and time per stage.

    run_plan(plan, plan_file=..., strategy="ckplan" | baseline name, ...) -> RunReport
    validate_plan(plan, plan_file=..., stage=None, device="cpu") -> [StageCheck]
"""

from planner.runtime.checks import unsupported_setup
from planner.runtime.launcher import in_torchrun, rank_threads, run_plan
from planner.runtime.replay import StageCheck, replay_order, validate_plan

__all__ = [
    "StageCheck", "in_torchrun", "rank_threads", "replay_order", "run_plan", "unsupported_setup", "validate_plan",
]
