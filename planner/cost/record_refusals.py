"""The settings a runtime's record refuses, each in one sentence that names it (planner/cost/runtimes.py
refused_settings reads them): torch.compile where the runtime compiles nothing, Megatron-LM's timer levels where the
runtime's timers were not read."""

from __future__ import annotations

from planner.cost.runtime_facts import RuntimeFacts


def timers_refused(training, record: RuntimeFacts) -> list[str]:
    """Megatron-LM's --timing-log-level above 0 under a runtime whose timers were not read (`record`.timer_syncs
    empty)."""
    level = getattr(training, "timing_log_level", 0)
    if not level or record.timer_syncs:
        return []
    return [f"--timing-log-level {level} is Megatron-LM's, read for --runtime megatron only; {record.name}'s timers "
            "were not read: drop it or choose --runtime megatron"]


def compile_refused(training, record: RuntimeFacts) -> list[str]:
    """--compile (`training`'s compile, compile_loss) under a runtime with no setting that
    torch.compiles the model (`record`.compiles_model False): one sentence naming the runtime and
    what it runs instead; none where nothing is compiled or the runtime compiles."""
    loss = training.compile if training.compile_loss is None else training.compile_loss
    said = ",".join(name for name, on in (("model", training.compile), ("loss", loss)) if on)
    if not said or record.compiles_model:
        return []
    return [f"--compile {said} asks for torch.compile, and {record.name}'s runtime ({record.version}) does not "
            f"compile the model: it runs {record.runs_instead}; drop --compile, or score with --runtime torchtitan"]


def test_mode_refused(training, record: RuntimeFacts) -> list[str]:
    """Megatron-LM's --test-mode under a runtime whose record has no realtime check (host_rest_linears without
    "realtime_tests")."""
    if not getattr(training, "test_mode", False) or any(name == "realtime_tests" for name, *_ in record.host_rest_linears):
        return []
    return [f"--test-mode is Megatron-LM's (its attention's realtime q/k norm checks), read for --runtime megatron only; "
            f"{record.name} runs no such check: drop it or choose --runtime megatron"]
