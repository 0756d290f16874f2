"""What every export says about the runtime a plan was scored as: the record (runtime and version,
planner/cost/runtimes.py) in its header, and the torch.compile components the cost model charged
compiled, which a target writes where it has a key (torchtitan's compile.enable and
compile.components). A target with no setting that compiles the model refuses the plan in one
sentence: its re-score would charge the compiled layers' memory to a runtime that runs them eager,
and call the export fitting where it may not (the profile an export scores with holds the
compiled figures in place of the eager ones)."""

from __future__ import annotations

import json

from planner.cost import runtimes
from planner.cost.rules import loss_compiled
from planner.errors import UserError

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


def refuse_uncompiled_target(setup, target: str) -> None:
    """One sentence where the plan was scored with torch.compile and `target` has no setting that
    compiles the model (its runtime record's compiles_model False)."""
    compiled = compiled_components(setup)
    record = runtimes.facts(TARGET_RUNTIME[target])
    if compiled and not record.compiles_model:
        raise UserError(f"this plan was scored with torch.compile of the {' and the '.join(compiled)} (--compile "
                        f"{','.join(compiled)}), and {target} has no setting that compiles the model: it runs "
                        f"{record.runs_instead}, so the plan's compiled memory and time would not hold there; solve "
                        f"with --runtime {record.name} (without --compile) and export that plan")



def megatron_fp8_unwritten(training) -> list[str]:
    """The FP8 flags a Megatron-LM export does not write, as the plan's FP8 was scored: delayed scaling with its
    history and group (--fp8-delayed-scaling), tensorwise (--fp8-current-scaling), or either where neither was said;
    [] without --float8."""
    if not training.float8:
        return []
    if training.fp8_delayed_scaling:
        recipe = ("--fp8-recipe delayed (scored with --fp8-delayed-scaling) --fp8-amax-history-len "
                  f"{training.fp8_amax_history_len or 1}" + (" --tp-only-amax-red" if training.fp8_amax_tp_only else ""))
    elif training.fp8_current_scaling:
        recipe = "--fp8-recipe tensorwise (scored with --fp8-current-scaling)"
    else:
        recipe = "--fp8-recipe tensorwise (or delayed)"
    weights = " --fp8-param-gather (scored with --fp8-all-gather)" if training.fp8_all_gather else ""
    return [f"FP8 (scored with --float8): not written here; give --fp8-format hybrid {recipe}{weights}."]
