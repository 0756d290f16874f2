"""Megatron-LM's data-parallel overlap as options of the commands that score a plan (DataParallelSetup's
overlap_grad_reduce ... param_gather_with_step; planner/cost/megatron_dp.py) and Megatron-FSDP's double buffers and
communication unit (planner/cost/megatron_fsdp.py), named as Megatron-LM's flags."""

from __future__ import annotations

import click

from planner.errors import UserError

DDP_OPTIONS = [
    click.option("--overlap-grad-reduce/--no-overlap-grad-reduce", "overlap_grad_reduce", default=None,
                 help="--runtime megatron: the gradient reduction issued bucket by bucket beside the last microbatch's "
                      "backward, or after the last backward, exposed [default: the runtime record's: overlapped]."),
    click.option("--overlap-param-gather", is_flag=True, default=False,
                 help="--runtime megatron --zero 1: the distributed optimizer's parameter all-gather waited for bucket "
                      "by bucket in the next forward, not in the step."),
    click.option("--ddp-bucket-size", "ddp_bucket_size", type=click.IntRange(min=1), default=None, metavar="PARAMS",
                 help="--runtime megatron: parameters a gradient bucket holds [default: max(40M, 1M x the "
                      "data-parallel ranks), megatron-core's]."),
    click.option("--no-align-grad-reduce", is_flag=True, default=False,
                 help="--runtime megatron, interleaved: each chunk's reduction at its own last backward."),
    click.option("--no-align-param-gather", is_flag=True, default=False,
                 help="--runtime megatron, interleaved: each chunk's gather at its own first forward."),
    click.option("--overlap-param-gather-with-optimizer-step", "param_gather_with_step", is_flag=True, default=False,
                 help="--runtime megatron, interleaved, with --overlap-param-gather: the first chunk's gather issued "
                      "inside the optimizer step."),
    click.option("--fsdp-double-buffer", is_flag=True, default=False,
                 help="--runtime megatron --zero 3 (Megatron-FSDP): two units' gathered weights and gradient buckets "
                      "in fixed slots held for the run."),
    click.option("--suggested-communication-unit-size", "suggested_communication_unit_size",
                 type=click.IntRange(min=1), default=None, metavar="ELEMENTS",
                 help="--runtime megatron --zero 3 (Megatron-FSDP): elements its reduce queue holds, half of them its "
                      "gather prefetch [default: max(1e9, 2 x the mean block's parameters)]."),
]
DDP_OPTION_NAMES = ("overlap_grad_reduce", "overlap_param_gather", "ddp_bucket_size", "no_align_grad_reduce",
                    "no_align_param_gather", "param_gather_with_step", "fsdp_double_buffer",
                    "suggested_communication_unit_size")


def ddp_given(kwargs: dict) -> dict:
    """The options given (popped from `kwargs`), as DataParallelSetup's fields; empty where none is."""
    values = {name: kwargs.pop(name) for name in DDP_OPTION_NAMES}
    fields = {}
    if values["overlap_grad_reduce"] is not None:
        fields["overlap_grad_reduce"] = values["overlap_grad_reduce"]
    for name, field, on in (("overlap_param_gather", "overlap_param_gather", True),
                            ("ddp_bucket_size", "bucket_params", None),
                            ("no_align_grad_reduce", "align_grad_reduce", False),
                            ("no_align_param_gather", "align_param_gather", False),
                            ("param_gather_with_step", "param_gather_with_step", True),
                            ("fsdp_double_buffer", "fsdp_double_buffer", True),
                            ("suggested_communication_unit_size", "suggested_communication_unit_size", None)):
        if values[name]:
            fields[field] = values[name] if on is None else on
    return fields


def check_ddp(fields: dict, *, runtime: str, zero: int, chunks: int) -> None:
    """One sentence where Megatron-LM's DDP settings are given to a plan they do not apply to."""
    if not fields:
        return
    from planner.cost import runtimes

    flag = "--" + next(iter(fields)).replace("_", "-")
    if not runtimes.facts(runtime).ddp_buckets:
        raise UserError(f"{flag} is Megatron-LM's DDP setting, and the plan is scored for {runtime}'s runtime; drop it "
                        "or give --runtime megatron")
    fsdp = [name for name in ("fsdp_double_buffer", "suggested_communication_unit_size") if name in fields]
    if fsdp and zero != 3:
        raise UserError(f"--{fsdp[0].replace('_', '-')} is Megatron-FSDP's setting under ZeRO 3 (its units); give "
                        "--zero 3 or drop it")
    if fields.get("overlap_param_gather") and zero != 1:
        raise UserError("--overlap-param-gather is the distributed optimizer's (--zero 1) gather; give --zero 1 or "
                        "drop it")
    if fields.get("overlap_param_gather") and fields.get("overlap_grad_reduce") is False:
        raise UserError("--overlap-param-gather needs the reductions overlapped too (Megatron-LM refuses it without); "
                        "drop --no-overlap-grad-reduce")
    if fields.get("param_gather_with_step") and (not fields.get("overlap_param_gather") or chunks == 1):
        raise UserError("--overlap-param-gather-with-optimizer-step needs --overlap-param-gather and an interleaved "
                        "schedule (--chunks 2 or more), as Megatron-LM does")
