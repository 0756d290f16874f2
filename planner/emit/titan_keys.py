"""The keys a torchtitan version takes for a plan's batch, microbatches and sequence length, each
with the version range it holds for (planner/emit/torchtitan.py writes them).

Read at pytorch/torchtitan (fetched; main at b5bcd76c, 2026-08-21) and the pip release 0.3.0 (the
newest on the index, `pip download torchtitan --no-deps`; its config/configs.py is main's at
5ab3a0fd1, 2026-08-18):
- 0.2.x (TOML, config/job_config.py at 238fa9953e4a) and 0.3.0 (Python, config/configs.py 36-53 of
  the wheel): `training.local_batch_size` (sequences a data-parallel rank runs per gradient-
  accumulation step; with a pipeline it is split into `parallelism.pipeline_parallel_microbatch_size`
  microbatches), `training.global_batch_size` (-1: local x the batch degree; larger accumulates
  gradients), `training.seq_len`.
- main from 73aed7f6c ("fold batch dim", 2026-08-20) on: the batch is folded into tokens.
  `training.num_tokens_per_microbatch_per_dp_rank` (token slots a data-parallel rank runs in one
  forward or pipeline microbatch), `training.num_tokens_per_train_step` (-1: that x
  num_pp_microbatches x the dp degree; larger accumulates gradients), `training.max_context_length`
  (the longest a sequence runs: positions reset at it, and language models attend block-causally
  within it, models/common/config_utils.py get_attention_config at b5bcd76c), and
  `parallelism.num_pp_microbatches` (microbatches a rank runs per accumulation step, ignored without
  a pipeline: trainer.py 409-427 at b5bcd76c). `TrainingConfig` is a slots dataclass: a key of
  another version raises AttributeError when the config function sets it.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import UserError

NEWEST_RELEASE = "0.3.0"
MAIN = "main"
MAIN_READ_AT = "b5bcd76c (2026-08-21)"


@dataclass(frozen=True)
class Version:
    """What a torchtitan version takes: the file kind, the head's name, how a batch is counted."""

    name: str  # as the user gave it: 0.2.2, 0.3.0, main
    python: bool  # configured by a Python config function (0.3.0 on), else a job TOML
    tokens: bool  # the batch folded into token counts (main since 73aed7f6c)

    @property
    def head(self) -> str:
        """The output projection's FQN: `output` in 0.2.x's llama3, `lm_head` from 0.3.0."""
        return "lm_head" if self.python else "output"


def parse(text: str) -> Version:
    """A release number (0.2.0 or newer) or `main`."""
    if text.strip().lower() == MAIN:
        return Version(name=MAIN, python=True, tokens=True)
    parts = text.strip().lstrip("v").split(".")
    if len(parts) < 2 or not all(part.isdigit() for part in parts[:2]):
        raise UserError(f"--torchtitan-version {text!r}: give a release number such as {NEWEST_RELEASE} or 0.2.2, "
                        f"or {MAIN} (torchtitan after 73aed7f6c, read at {MAIN_READ_AT})")
    number = (int(parts[0]), int(parts[1]))
    if number < (0, 2):
        raise UserError(f"torchtitan {text} has no module_fqns_per_model_part to split stages by name; "
                        "use --torchtitan-version 0.2.0 or newer")
    if number > (0, 3):
        raise UserError(f"torchtitan {text} is not a release ckplan has read (the newest is {NEWEST_RELEASE}); give "
                        f"{NEWEST_RELEASE}, or {MAIN} for torchtitan's main branch after 73aed7f6c")
    return Version(name=text.strip(), python=number >= (0, 3), tokens=False)


def microbatch_line(version: Version, setup, prefix: str) -> str:
    """The pipeline's microbatches: their size in sequences (0.2.x, 0.3.0), or their count (main,
    where a microbatch's size is num_tokens_per_microbatch_per_dp_rank)."""
    if version.tokens:
        return f"{prefix}num_pp_microbatches = {setup.pipeline.microbatches if setup.pipeline.stages > 1 else 1}"
    return f"{prefix}pipeline_parallel_microbatch_size = {setup.pipeline.micro_batch_size}"


def batch_lines(version: Version, setup, seq_len: int | None, prefix: str) -> str:
    """The microbatches and sequence length as the version takes them (module docstring). Without a
    pipeline the plan's microbatches are gradient-accumulation steps; the batch degree is
    dp_replicate x dp_shard, the cp ranks not counted."""
    indent = prefix[:len(prefix) - len(prefix.lstrip())]
    if version.tokens:
        return _token_lines(setup, seq_len, prefix)
    pipeline = setup.pipeline
    if pipeline.stages > 1 or pipeline.microbatches == 1:
        lines = (f"{prefix}local_batch_size = {pipeline.microbatches * pipeline.micro_batch_size}  "
                 f"# {pipeline.microbatches} microbatches")
    else:
        batch_degree = setup.data_parallel.dp // setup.training.context_parallel
        lines = (f"{indent}# {pipeline.microbatches} microbatches: no pipeline splits the local batch, so gradient "
                 f"accumulation does\n{prefix}local_batch_size = {pipeline.micro_batch_size}\n"
                 f"{prefix}global_batch_size = {pipeline.microbatches * pipeline.micro_batch_size * batch_degree}")
    if seq_len is None:
        return lines + (f"\n{indent}# seq_len: this profile does not record it; set it as your example_batch() "
                        "makes it")
    return lines + f"\n{prefix}seq_len = {int(seq_len)}"


def _token_lines(setup, seq_len: int | None, prefix: str) -> str:
    """main: a microbatch of b sequences of s tokens is b x s token slots, max_context_length s (so
    each s-token window is attended causally on its own, as the plan scored b sequences); the step's
    tokens are written whole, so that a base config's own count cannot change the accumulation."""
    if seq_len is None:
        raise UserError("torchtitan main counts a microbatch in tokens (training.num_tokens_per_microbatch_per_dp_"
                        "rank, since 73aed7f6c) and this profile does not record its sequence length; profile with "
                        f"--seq-len, or export for --torchtitan-version {NEWEST_RELEASE}")
    pipeline, indent = setup.pipeline, prefix[:len(prefix) - len(prefix.lstrip())]
    tokens = pipeline.micro_batch_size * int(seq_len)
    batch_degree = setup.data_parallel.dp // setup.training.context_parallel
    step = tokens * pipeline.microbatches * batch_degree
    accumulation = 1 if pipeline.stages > 1 else pipeline.microbatches
    return (f"{indent}# a microbatch: {pipeline.micro_batch_size} sequence(s) of {int(seq_len)} tokens; "
            f"{accumulation} gradient-accumulation step(s) a train step\n"
            f"{prefix}num_tokens_per_microbatch_per_dp_rank = {tokens}\n"
            f"{prefix}num_tokens_per_train_step = {step}\n"
            f"{prefix}max_context_length = {int(seq_len)}")


def graphs_line(version: Version, prefix: str) -> str:
    """CUDA graphs off: 0.3.0 and main capture the step in a CUDA graph unless
    training.disable_cuda_graphs (since f84224af0, 2026-08-13), refuse that with a pipeline ("CUDA
    graphs do not support pipeline parallelism yet", Trainer.Config._validate_cuda_graphs: trainer.py
    179-186 in 0.3.0, 168-176 at b5bcd76c) and then zero gradients in place rather than free them
    (zero_grad(set_to_none=disable_cuda_graphs), 874 / 845): ckplan scores the step without graphs."""
    if not version.python:
        return ""
    return f"\n{prefix}disable_cuda_graphs = True  # the step as ckplan scored it: no CUDA graph capture"


def float8_note(version: Version, fp8_all_gather: bool) -> str:
    """What to give torchtitan for the Float8 linears the plan was scored with (not written)."""
    if version.python:
        return ("Float8 linears (scored with --float8" + (" --fp8-all-gather" if fp8_all_gather else "") + " as "
                "torchao's tensorwise Float8Linear): not written; torchtitan " + version.name + "'s "
                "Float8LinearConverter takes the rowwise recipes only (components/quantization/float8.py 58 in "
                "0.3.0, the same at b5bcd76c) and has no FSDP float8 all-gather, so its run differs from the "
                "scored one; give model_registry(..., converters=[Float8LinearConverter.Config(filter_fqns="
                "[\"lm_head\"])]) in your base config if you want it.")
    return ("Float8 linears (scored with --float8" + (" --fp8-all-gather" if fp8_all_gather else "") + "): not "
            "written here; give the job model.converters = [\"float8\"] with quantize.linear.float8.filter_fqns = "
            "[\"output\"]" + (" and enable_fsdp_float8_all_gather = true" if fp8_all_gather else "") + ".")


def loss_lines(version: Version, setup, prefix: str) -> str:
    """The loss as the plan was scored, over the base config's (torchtitan 0.3.0's own llama3 / qwen3
    configs run ChunkedLossWrapper, components/loss.py 567-836): its chunks (setup.training's
    chunked_cross_entropy, planner/cost/chunkedloss.py) wrapped around the loss the base runs, or
    without chunks the loss the base's wrapper wraps. 0.2.x's TOML has no such loss (loss_note)."""
    if not version.python:
        return ""
    chunks = setup.training.chunked_cross_entropy
    inner = 'getattr(config.loss, "loss_fn", config.loss)'
    if not chunks:
        return f"\n{prefix}config.loss = {inner}  # the loss as ckplan scored it: on whole logits"
    return (f"\n{prefix}from torchtitan.components.loss import ChunkedLossWrapper\n"
            f"{prefix}config.loss = ChunkedLossWrapper.Config(num_chunks={chunks}, loss_fn={inner})  # as scored")


def loss_note(version: Version, setup) -> list[str]:
    """What the export cannot say of the plan's chunked loss (0.2.x: no ChunkedLossWrapper)."""
    chunks = setup.training.chunked_cross_entropy
    if version.python or not chunks:
        return []
    return [f"chunked cross-entropy ({chunks} chunks, as scored): torchtitan {version.name} has no ChunkedLossWrapper "
            "(0.3.0 does); this job runs the loss on whole logits, more memory than scored: export for 0.3.0 or main."]
