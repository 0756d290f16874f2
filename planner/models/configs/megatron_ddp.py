"""Megatron-LM's data-parallel flags: what its distributed optimizer or FSDP shards, and how its DDP
overlaps the reductions and gathers with compute (JobSettings.ddp; planner/cost/megatron_dp.py), as
megatron/training/arguments.py defines them at d98e8a64 (3121-3155; the checks 1000-1072)."""

from __future__ import annotations

from planner.errors import UserError
from planner.models.configs import Job
from planner.models.configs.megatron_args import Flags, positive
from planner.models.configs.megatron_flags import FSDP_ZERO


def read_data_parallel(flags: Flags, job: Job) -> None:
    """--use-distributed-optimizer (ZeRO 1), --use-megatron-fsdp (its sharding strategy), the optimizer's
    instances, and the DDP overlap flags (read_overlap)."""
    if flags.take("--use-distributed-optimizer", "optimizer state sharded over data-parallel ranks (ZeRO 1)",
                  bool, False):
        job.zero = 1
    if flags.take("--use-megatron-fsdp", "Megatron FSDP: sharded over data-parallel ranks as "
                  "--data-parallel-sharding-strategy says (default optim_grads_params: ZeRO 3)", bool, False):
        strategy = flags.take("--data-parallel-sharding-strategy", "what Megatron FSDP shards", str,
                              "optim_grads_params")
        if strategy not in FSDP_ZERO:
            raise UserError(f"--data-parallel-sharding-strategy {strategy!r}: give one of {', '.join(FSDP_ZERO)}")
        job.zero = FSDP_ZERO[strategy]
        read_megatron_fsdp(flags, job, strategy)
    job.dp_replicate = positive("--num-distributed-optimizer-instances", flags.take(
        "--num-distributed-optimizer-instances", "the distributed optimizer sharded within groups of the data-parallel "
        "ranks, replicated across this many (megatron-core parallel_state.py 918-929)", int, 1))
    read_overlap(flags, job)


# What ckplan reads of each Megatron-FSDP strategy (megatron_fsdp/param_and_grad_buffer.py 1761-1790 at
# megatron-core 92c8482e: which of the weight, main-weight and gradient buffers it shards)
FSDP_STRATEGY_NOTES = {
    "optim_grads_params": "ZeRO 3: Megatron-FSDP's units, double buffers, prefetch and gradient buckets "
                          "(planner/cost/megatron_fsdp.py)",
    "optim_grads": "ZeRO 2: weights whole, gradients and optimizer sharded; Megatron-FSDP's gradient buckets are "
                   "not read (FSDP2's largest-layer term charged in their place)",
    "optim": "ZeRO 1: the optimizer's fp32 state sharded, as the distributed optimizer's (its buckets charged)",
    "no_shard": "ZeRO 0: nothing sharded, as Megatron-LM's DDP",
}


def read_megatron_fsdp(flags: Flags, job: Job, strategy: str) -> None:
    """Megatron-FSDP's strategy note and, under optim_grads_params (the strategy that forms units), its double
    buffers and communication unit (JobSettings.ddp; planner/cost/megatron_fsdp.py). Under another strategy they
    are left to the flags not modelled: double buffers need units (param_and_grad_buffer.py 1791 at 92c8482e)."""
    if flags.sink and flags.sink[-1][0] == "--data-parallel-sharding-strategy":
        flags.sink[-1] = (*flags.sink[-1][:3], FSDP_STRATEGY_NOTES[strategy])
    else:
        job.notes.append(f"Megatron-FSDP's default strategy {strategy}: {FSDP_STRATEGY_NOTES[strategy]}")
    if strategy != "optim_grads_params":
        return
    ddp = job.modelled.ddp
    if flags.take("--fsdp-double-buffer", "two units' gathered weights and gradient buckets in fixed slots held "
                  "for the run (planner/cost/megatron_fsdp.py)", bool, False):
        ddp["fsdp_double_buffer"] = True
    size = flags.take("--suggested-communication-unit-size", "elements Megatron-FSDP's reduce queue holds, half of "
                      "them its gather prefetch (default max(1e9, 2 x the mean unit))", int)
    if size is not None:
        ddp["suggested_communication_unit_size"] = positive("--suggested-communication-unit-size", size)


def read_overlap(flags: Flags, job: Job) -> None:
    """The DDP's overlap: absent flags are Megatron-LM's defaults (no overlap; aligned under interleaving),
    each one given is modelled (planner/cost/megatron_dp.py) or refused as Megatron-LM refuses it."""
    ddp = job.modelled.ddp
    ddp["overlap_grad_reduce"] = bool(flags.take(
        "--overlap-grad-reduce", "the gradient reduction issued bucket by bucket beside the backward's last "
        "microbatch (absent: after the last backward, exposed)", bool, False))
    gather = bool(flags.take("--overlap-param-gather", "the distributed optimizer's parameter all-gather waited "
                             "for bucket by bucket in the next forward (absent: in the step, exposed)", bool, False))
    if gather and job.zero >= 2:
        flags.sink[-1] = (*flags.sink[-1][:2], "modelled", "Megatron FSDP's weight gathers prefetched beside the "
                          "compute (the runtime record's prefetches_zero3_gathers, dataparallel.exposed_comm_ms)")
    elif gather and job.zero != 1:  # arguments.py 1024-1029 at d98e8a64
        raise UserError("--overlap-param-gather needs --use-distributed-optimizer; Megatron-LM refuses it without")
    if gather and not ddp["overlap_grad_reduce"]:
        raise UserError("--overlap-param-gather needs --overlap-grad-reduce; Megatron-LM refuses it without")
    ddp["overlap_param_gather"] = gather and job.zero == 1
    size = flags.take("--ddp-bucket-size", "parameters a gradient bucket holds (default max(40M, 1M x the dp·cp "
                      "ranks)): where the first pipeline rank's first chunk issues its reductions", int)
    if size is not None:
        ddp["bucket_params"] = positive("--ddp-bucket-size", size)
    ddp["align_grad_reduce"] = not flags.take(
        "--no-align-grad-reduce", "each chunk's reduction issued at its own last backward, not aligned across "
        "pipeline ranks (interleaved)", bool, False)
    ddp["align_param_gather"] = not flags.take(
        "--no-align-param-gather", "each chunk's gather issued at its own first forward, not aligned across "
        "pipeline ranks (interleaved)", bool, False)
    with_step = bool(flags.take("--overlap-param-gather-with-optimizer-step", "the first chunk's parameter "
                                "all-gather issued inside the optimizer step, beside the other chunks' steps",
                                bool, False))
    if with_step and (not ddp["overlap_param_gather"] or job.chunks == 1):  # arguments.py 1066-1072
        raise UserError("--overlap-param-gather-with-optimizer-step needs --overlap-param-gather, the distributed "
                        "optimizer and an interleaved schedule; Megatron-LM refuses it without")
    ddp["param_gather_with_step"] = with_step
