"""DeepSpeed ZeRO 3's ds_config knobs that set what its coordinator keeps gathered, and its gradient bucket's size,
as options of the commands that score a plan (DataParallelSetup's stage3_* and reduce_bucket_size;
planner/cost/deepspeed_terms.py), named as the ds_config's `zero_optimization` keys. Each defaults to DeepSpeed's
own (deepspeed/runtime/zero/config.py DeepSpeedZeroConfig, the same from v0.6.2 to edaa7221): framework-facts §103,
§105, §124."""

from __future__ import annotations

import click

from planner.errors import UserError
from planner.schema.setup import DEEPSPEED_CHECKPOINTING


def _elements(text: str) -> int:
    """A count of elements as a ds_config writes it: 3e9 or 3000000000 (DeepSpeed's pp_int casts to int)."""
    try:
        value = float(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a number of elements (e.g. 3e9)") from None
    if not 0 <= value <= 1e18 or value != int(value):
        raise click.BadParameter(f"{text!r} is not a whole number of elements from 0 to 1e18")
    return int(value)


class _Elements(click.ParamType):
    name = "ELEMENTS"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return _elements(str(value))
        except click.BadParameter as exc:
            self.fail(str(exc), param, ctx)


DEEPSPEED_OPTIONS = [
    click.option("--stage3-max-reuse-distance", "stage3_max_reuse_distance", type=_Elements(), default=None,
                 help="--runtime deepspeed --zero 3: a submodule's parameters stay gathered after it runs where "
                      "they are used again within this many parameters' elements of the trace; a checkpointed "
                      "block's others are gathered a third time for the backward [default: DeepSpeed's, 1e9]."),
    click.option("--stage3-prefetch-bucket-size", "stage3_prefetch_bucket_size", type=_Elements(), default=None,
                 help="--runtime deepspeed --zero 3: elements prefetched beside the submodule computing (at least "
                      "the next parameter) [default: DeepSpeed's, 5e7]."),
    click.option("--stage3-max-live-parameters", "stage3_max_live_parameters", type=_Elements(), default=None,
                 help="--runtime deepspeed --zero 3: no prefetch once this many elements are gathered "
                      "[default: DeepSpeed's, 1e9]."),
    click.option("--reduce-bucket-size", "reduce_bucket_size", type=_Elements(), default=None,
                 help="--runtime deepspeed --zero 3: the gradients' bucket, a flat buffer of this many elements "
                      "in the training dtype on the GPU from the start (contiguous_gradients) [default: DeepSpeed's, "
                      "5e8]."),
    click.option("--checkpoint-in-cpu", "checkpoint_in_cpu", is_flag=True, default=None,
                 help="--runtime deepspeed: each whole-layer checkpoint's input copied to the host in the forward and "
                      "back before its rerun, blocking the compute stream (DeepSpeed's cpu_checkpointing; "
                      "Megatron-DeepSpeed's flag)."),
    click.option("--partition-activations", "partition_activations", is_flag=True, default=None,
                 help="--runtime deepspeed: each checkpoint split over the tensor-parallel group (at tensor "
                      "parallelism 1, as ckplan scores DeepSpeed, nothing to split: no change)."),
    click.option("--contiguous-checkpointing", "contiguous_checkpointing", is_flag=True, default=None,
                 help="--runtime deepspeed --partition-activations: the checkpoints in preallocated buffers, one a "
                      "layer (DeepSpeed's contiguous_memory_optimization; the same bytes at the backward's peak)."),
    click.option("--synchronize-each-layer", "synchronize_each_layer", is_flag=True, default=None,
                 help="--runtime deepspeed: torch.cuda.synchronize() at each checkpoint's boundaries (the host "
                      "waits; the GPU's time is not charged more)."),
]
# DeepSpeed's activation-checkpointing settings (deepspeed.checkpointing.configure; planner/cost/deepspeed_ckpt.py)
CHECKPOINTING = DEEPSPEED_CHECKPOINTING
DEEPSPEED_OPTION_NAMES = ("stage3_max_reuse_distance", "stage3_prefetch_bucket_size", "stage3_max_live_parameters",
                          "reduce_bucket_size", *CHECKPOINTING)
# the knobs that set what the coordinator keeps gathered: they need the block's submodules (deepspeed_terms.charged)
SUBMODULE_KNOBS = ("stage3_max_reuse_distance", "stage3_prefetch_bucket_size", "stage3_max_live_parameters")


def deepspeed_given(kwargs: dict) -> dict:
    """The options given (popped from `kwargs`), as DataParallelSetup's fields; empty where none is."""
    values = {name: kwargs.pop(name, None) for name in DEEPSPEED_OPTION_NAMES}
    return {name: value for name, value in values.items() if value is not None and value is not False}


def check_deepspeed(fields: dict, profile, setup) -> None:
    """One sentence where a stage3 knob is given to a plan it does not change: another runtime, another
    ZeRO stage, nothing sharded, or a profile whose blocks ckplan cannot split into DeepSpeed's submodules."""
    if not fields:
        return
    from planner.cost import deepspeed_terms

    flag = "--" + next(iter(fields)).replace("_", "-")
    runtime, zero = setup.training.runtime, setup.data_parallel.zero
    if runtime != "deepspeed":  # the checkpointing settings off DeepSpeed: TrainSetup's own check refused them
        raise UserError(f"{flag} is DeepSpeed's ZeRO 3 setting, and the plan is scored for {runtime}'s runtime; "
                        "drop it or give --runtime deepspeed")
    check_checkpointing(fields, profile)
    fields = {name: value for name, value in fields.items() if name not in CHECKPOINTING}
    if not fields:
        return
    flag = "--" + next(iter(fields)).replace("_", "-")
    if zero != 3:
        raise UserError(f"{flag} sets what DeepSpeed's ZeRO 3 keeps gathered, and the plan runs ZeRO {zero}; "
                        "give --zero 3 or drop it")
    if not deepspeed_terms.runs_zero3(setup):
        raise UserError(f"{flag} changes nothing where ZeRO 3 partitions over one rank or keeps weights whole "
                        "through the iteration (--zero-gather per-iteration); drop it")
    knobs = [name for name in fields if name in SUBMODULE_KNOBS]
    if knobs and not deepspeed_terms.charged(profile, setup):
        flag = "--" + knobs[0].replace("_", "-")
        raise UserError(f"{flag} needs the block's submodules, which ckplan knows only for an analytic profile's "
                        "dense GPT or LLaMA-style block at tensor parallelism 1 (`ckplan profile --arch`); drop it")


def check_checkpointing(fields: dict, profile) -> None:
    """DeepSpeed's own checks of its checkpointing settings (checkpointing.py configure, v0.6.2), and ckplan's:
    partitioning is modelled where it splits nothing (tensor parallelism 1, as ckplan scores DeepSpeed)."""
    if fields.get("contiguous_checkpointing") and not fields.get("partition_activations"):
        raise UserError("--contiguous-checkpointing needs --partition-activations (DeepSpeed asserts \"Contiguous "
                        "Checkpointing is only available with partitioned activations\"); give both or drop it")
    tp = int(profile.assumptions.get("tp", 1))
    if fields.get("partition_activations") and tp != 1:
        raise UserError(f"--partition-activations splits each checkpoint over the {tp} tensor-parallel ranks and "
                        "all-gathers it before the rerun, which ckplan does not model (it does at tensor parallelism "
                        "1, where nothing is split); drop it")


def checkpointing_note(setup) -> str | None:
    """The sentence saying what DeepSpeed's checkpointing settings do to the plan; None where none is given."""
    dp = setup.data_parallel
    if setup.training.runtime != "deepspeed" or not any(getattr(dp, name) for name in CHECKPOINTING):
        return None
    said = []
    if dp.checkpoint_in_cpu:
        said.append("--checkpoint-in-cpu: each whole-layer checkpoint on the host, copied out and back blocking the "
                    f"compute stream at {dp.host_gb_per_s or 0:g} GB/s, or where slower at the GPU's server's rate to "
                    "and from pageable memory (planner/cost/deepspeed_ckpt.py)")
    if dp.partition_activations:
        said.append("--partition-activations at tensor parallelism 1: nothing split (its device copies of each "
                    "checkpoint not charged)")
    if dp.contiguous_checkpointing:
        said.append("--contiguous-checkpointing: one preallocated buffer a checkpoint, the same bytes at the "
                    "backward's peak")
    if dp.synchronize_each_layer:
        said.append("--synchronize-each-layer: the host waits at each checkpoint's boundaries, not charged")
    return "DeepSpeed's activation checkpointing: " + "; ".join(said)


def deepspeed_note(profile, setup) -> str | None:
    """The sentence saying DeepSpeed ZeRO 3's working set and third gather are not charged on this plan, and
    why (deepspeed_terms.not_charged); None where they are, or ZeRO 3's coordinator does not run."""
    from planner.cost import deepspeed_terms

    return deepspeed_terms.not_charged(profile, setup)
