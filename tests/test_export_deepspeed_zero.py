"""The DeepSpeed export's config says the ZeRO stage its re-score charged: without it DeepSpeed runs stage 0,
whose bf16 optimizer keeps whole fp32 gradients (framework-facts §69)."""

from __future__ import annotations

import ast

from export_plans import write

from planner import io
from planner.emit import deepspeed


def _config(plan, profile) -> dict:
    text = deepspeed.export(plan, profile, plan_file="plan.yaml").text
    line = next(line for line in text.splitlines() if line.startswith("CKPLAN_DS_CONFIG = "))
    return ast.literal_eval(line.removeprefix("CKPLAN_DS_CONFIG = "))


def test_the_config_carries_the_zero_stage_the_plan_was_scored_with(tmp_path):
    _, plan, _ = write(tmp_path, [4, 3, 3], {"layers.1"})
    profile = io.load_profile(tmp_path / "llm.json")
    sharded = plan.model_copy(update={"setup": plan.setup.model_copy(update={"dp": 4, "zero": 1})})
    assert _config(sharded, profile)["zero_optimization"] == {"stage": 1}
    # ZeRO 2 beside a pipeline is exported as the 1 DeepSpeed runs (dp_support), and said in the config too
    assert _config(plan.model_copy(update={"setup": plan.setup.model_copy(update={"dp": 4, "zero": 2})}),
                   profile)["zero_optimization"] == {"stage": 1}
    assert "zero_optimization" not in _config(plan, profile)  # ZeRO 0: DeepSpeed's default
