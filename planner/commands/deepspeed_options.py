"""DeepSpeed ZeRO 3's ds_config knobs that set what its coordinator keeps gathered, and its gradient bucket's size,
as options of the commands that score a plan (DataParallelSetup's stage3_* and reduce_bucket_size;
planner/cost/deepspeed_terms.py), named as the ds_config's `zero_optimization` keys. Each defaults to DeepSpeed's
own (deepspeed/runtime/zero/config.py DeepSpeedZeroConfig, the same from v0.6.2 to edaa7221): framework-facts §103,
§105, §124."""

from __future__ import annotations

import click

from planner.errors import UserError


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
]
DEEPSPEED_OPTION_NAMES = ("stage3_max_reuse_distance", "stage3_prefetch_bucket_size", "stage3_max_live_parameters",
                          "reduce_bucket_size")
# the knobs that set what the coordinator keeps gathered: they need the block's submodules (deepspeed_terms.charged)
SUBMODULE_KNOBS = ("stage3_max_reuse_distance", "stage3_prefetch_bucket_size", "stage3_max_live_parameters")


def deepspeed_given(kwargs: dict) -> dict:
    """The options given (popped from `kwargs`), as DataParallelSetup's fields; empty where none is."""
    values = {name: kwargs.pop(name, None) for name in DEEPSPEED_OPTION_NAMES}
    return {name: value for name, value in values.items() if value is not None}


def check_deepspeed(fields: dict, profile, setup) -> None:
    """One sentence where a stage3 knob is given to a plan it does not change: another runtime, another
    ZeRO stage, nothing sharded, or a profile whose blocks ckplan cannot split into DeepSpeed's submodules."""
    if not fields:
        return
    from planner.cost import deepspeed_terms

    flag = "--" + next(iter(fields)).replace("_", "-")
    runtime, zero = setup.training.runtime, setup.data_parallel.zero
    if runtime != "deepspeed":
        raise UserError(f"{flag} is DeepSpeed's ZeRO 3 setting, and the plan is scored for {runtime}'s runtime; "
                        "drop it or give --runtime deepspeed")
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


def deepspeed_note(profile, setup) -> str | None:
    """The sentence saying DeepSpeed ZeRO 3's working set and third gather are not charged on this plan, and
    why (deepspeed_terms.not_charged); None where they are, or ZeRO 3's coordinator does not run."""
    from planner.cost import deepspeed_terms

    return deepspeed_terms.not_charged(profile, setup)
