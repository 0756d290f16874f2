"""A config's parallel degrees and batch keys checked against the GPUs it is scored on, each refusal said in
the file's own terms (Megatron-LM's flags, torchtitan's keys): what `evaluate --from-megatron / --from-torchtitan`
asks before it profiles (planner/commands/evaluate_config.py)."""

from __future__ import annotations

from planner.errors import UserError


def check_ep(job, *, dp: int, gpus: int) -> None:
    """The file's expert parallelism against the data-parallel ranks (x CP) its experts take, said
    in the file's own terms (expert_options.check_ep says it in ckplan's options)."""
    import math

    ranks = dp * job.cp
    if job.ep <= 1 or ranks % job.ep == 0:
        return
    check_folding(job, gpus=gpus)
    flag = "--expert-model-parallel-size" if job.framework == "megatron" else "parallelism.expert_parallel_degree"
    fix = ("change one of the degrees the file gives" if job.dp_given is not None else
           f"give --gpus N, a multiple of TP {job.tp} x PP {job.pp} x "
           f"{f'EP {job.ep}' if job.cp == 1 else f'lcm(EP {job.ep}, CP {job.cp})'} = "
           f"{job.tp * job.pp * math.lcm(job.ep, job.cp)}")
    raise UserError(f"{job.source}: {flag} {job.ep} does not divide the {ranks} data-parallel ranks that {gpus} GPUs "
                    f"over TP {job.tp} x PP {job.pp} leave (expert-parallel ranks are data-parallel ranks, in "
                    f"Megatron-LM and torchtitan); {fix}")


def check_folding(job, *, gpus: int) -> None:
    """Megatron-LM with --expert-tensor-parallel-size below TP lays its experts out on their own mesh:
    ETP x EP x PP dividing the world, the expert-parallel ranks taken from TP x CP x DP ("MoE parallel
    folding", megatron/core/parallel_state.py 874-883 at d98e8a64). ckplan splits experts over TP and
    places EP among the data-parallel ranks only: such a layout is refused as one it cannot score."""
    given = [s.value for s in job.settings if s.name == "--expert-tensor-parallel-size"]
    if job.framework != "megatron" or not given or not given[-1].isdigit() or int(given[-1]) >= job.tp:
        return
    etp = int(given[-1])
    if gpus % (etp * job.ep * job.pp):
        return
    raise UserError(f"{job.source}: --expert-tensor-parallel-size {etp} below TP {job.tp} with "
                    f"--expert-model-parallel-size {job.ep}: Megatron-LM takes its {job.ep} expert-parallel ranks "
                    f"from TP x CP x DP (ETP {etp} x EP {job.ep} x PP {job.pp} of the {gpus} GPUs, parallel_state.py "
                    f"874-883 at d98e8a64), which ckplan does not model (its experts are split over TP and placed "
                    f"among the data-parallel ranks); give --gpus a multiple of TP {job.tp} x PP {job.pp} x EP "
                    f"{job.ep} = {job.tp * job.pp * job.ep} to score the layout with ETP = TP")


def check_microbatches(job, microbatches: int, *, dp: int) -> None:
    """1F1B as ckplan scores it (torch's schedule) runs at least one microbatch a stage: said in the
    file's own batch keys (setup_options says it as --microbatches, which a config does not take)."""
    if job.schedule != "1F1B" or microbatches >= job.pp:
        return
    need = (f"--global-batch-size {job.pp * job.micro_batch_size * dp} or more (global batch = microbatches x "
            f"--micro-batch-size {job.micro_batch_size} x data parallelism {dp})" if job.framework == "megatron" else
            f"training.local_batch_size {job.pp * job.micro_batch_size} or more (pipeline_parallel_microbatch_size "
            f"{job.micro_batch_size} a microbatch)")
    raise UserError(f"{job.source}: {microbatches} microbatch{'es' if microbatches > 1 else ''} per pipeline, fewer "
                    f"than its {job.pp} stages, and ckplan scores 1F1B (torch's schedule) with at least one a stage; "
                    f"give {need}")


def microbatches_of(job, dp: int) -> tuple[int, list[str]]:
    """Microbatches per iteration per pipeline (gradient accumulation counted in)."""
    notes: list[str] = []
    per_rank = job.local_batch_size if job.framework == "torchtitan" else None
    if job.framework == "megatron":
        gbs = job.global_batch_size or job.micro_batch_size * dp
        if gbs % (job.micro_batch_size * dp):
            raise UserError(f"--global-batch-size {gbs} is not a multiple of --micro-batch-size "
                            f"{job.micro_batch_size} x data parallelism {dp}; Megatron-LM refuses it")
        return gbs // (job.micro_batch_size * dp), notes
    accumulate = 1
    if job.global_batch_size is not None:
        if job.global_batch_size % (per_rank * dp):
            raise UserError(f"training.global_batch_size {job.global_batch_size} is not a multiple of "
                            f"local_batch_size {per_rank} x data parallelism {dp}; torchtitan refuses it")
        accumulate = job.global_batch_size // (per_rank * dp)
    if accumulate > 1:
        notes.append(f"{accumulate} gradient-accumulation steps: scored as {accumulate} x the microbatches of one")
    return per_rank // job.micro_batch_size * accumulate, notes
