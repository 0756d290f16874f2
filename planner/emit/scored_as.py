"""What every export says about the runtime a plan was scored as: the record (runtime and version,
planner/cost/runtimes.py) in its header, and the torch.compile components the cost model charged
compiled, which a target writes where it has a key (torchtitan's compile.enable and
compile.components) and says in one sentence where it has none."""

from __future__ import annotations

import json

from planner.cost import runtimes
from planner.cost.rules import loss_compiled

# The runtime record whose facts describe what each export target runs (planner/cost/runtimes.py)
TARGET_RUNTIME = {"Megatron-LM": "megatron", "DeepSpeed": "deepspeed", "ColossalAI": "colossalai",
                  "torchtitan": "torchtitan"}


def record_line(plan_setup, export_setup=None) -> str:
    """The header line naming the record the plan was scored as, its values quoted as the setup
    spells them (training.runtime, training.runtime_version; the newest read where none was given),
    and the record the export was re-scored as where the target's runtime is another."""
    line = f"Scored as {_record(plan_setup)}"
    if export_setup is not None and export_setup.training.runtime != plan_setup.training.runtime:
        line += f"; this export re-scored as {_record(export_setup)}"
    return line + " (ckplan's records of each runtime's facts: planner/cost/runtimes.py)."


def _record(setup) -> str:
    training = setup.training
    record = runtimes.of(training)
    version = training.runtime_version or runtimes.VERSIONS[training.runtime][0]
    read_at = "" if record.version == version else f", read at {record.version}"
    return f"runtime = {json.dumps(training.runtime)}, runtime_version = {json.dumps(version)}{read_at}"


def compiled_components(setup) -> list[str]:
    """The components the cost model charged compiled, as torchtitan's compile.components names
    them: "model" where the setup compiles the layers, "loss" where it compiles the loss and the
    runtime's record compiles it (torchtitan 9dec370's does not: its loss was charged eager)."""
    training = setup.training
    loss = loss_compiled(training) and runtimes.of(training).loss_compiled is not None
    return [name for name, on in (("model", training.compile), ("loss", loss)) if on]


def no_compile_key(setup, target: str) -> list[str]:
    """One sentence where the plan was scored with torch.compile and `target` has no setting that
    compiles the model (its runtime record's compiles_model False); none otherwise."""
    compiled = compiled_components(setup)
    record = runtimes.facts(TARGET_RUNTIME[target])
    if not compiled or record.compiles_model:
        return []
    return [f"torch.compile of the {' and the '.join(compiled)} (scored compiled, --compile {','.join(compiled)}): "
            f"{target} has no setting for it and runs {record.runs_instead}, so the plan's compiled memory and time "
            f"do not hold there; solve with --runtime {record.name} (without --compile) for a plan it runs."]
