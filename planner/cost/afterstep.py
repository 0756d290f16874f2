"""What a rank holds after the optimizer step: static memory as Megatron-LM logs it.

Megatron-LM's `mem-allocated-bytes` is torch.cuda.memory_stats()["allocated_bytes.all.current"]
read after the optimizer step on the last rank (megatron/training/training.py 2523-2531, 6e091e1b).
Beside the weights, gradients and optimizer state (`static`), what is allocated then is what the
runtime keeps past the step, each from its record (planner/cost/runtimes.py):

- `keeps_last_input_and_grad`: each model chunk past the pipeline's first keeps its last
  microbatch's input and that input's gradient until its next forward (two stage inputs);
- the step's fp32 copy of the rank's 16-bit gradient shard (fp16-mixed, --grad-reduce-in-bf16: the record's
  fp16_grad_step_copy_bytes / bf16_grad_step_copy_bytes), set as each main parameter's .grad and freed only by
  the next train_step's zero_grad;
- the cuBLAS workspaces allocated once through torch's caching allocator: torch's own
  (`cublas_workspace_bytes`, CUBLAS_WORKSPACE_CONFIG), one for the forward's thread and one for
  autograd's (TORCH_BLAS_THREADS), and Transformer Engine's (`te_cublas_workspace`: 32 MiB on
  compute capability 9 and later, 4 MiB before), which Megatron-core's local spec never makes, and
  where the experts run TE's grouped GEMM (`te_grouped_gemm_workspaces`: Megatron-LM's
  --moe-grouped-gemm) one more of that size per compute stream it spreads their GEMMs over; under
  TE's userbuffers (--tp-comm-overlap, `te_ub_workspaces`) one allocation of three of that size
  for the overlapped GEMMs beside the plain one (te_userbuffers.py);
- under the local spec (`local_spec_buffer`, TrainingSetup.local_layers), Megatron-core's global
  memory buffer: DotProductAttention's baddbmm input, made at the first forward and never freed; under
  every spec (`output_layer_buffer`) the same buffer on the rank holding the last stage where sequence
  parallelism runs at TP > 1: the output layer's all-gathered input.

The activations, the pipeline's receive buffers and the loss are gone by then. The peak does not
read this: during the step the chunks' inputs are the ones the schedule already holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.cost import runtimes, te_userbuffers
from planner.cost.layers import LayerCost
from planner.errors import UserError
from planner.schema import CommSetup, DeviceInfo, Profile, TrainingSetup
from planner.units import DTYPE_BYTES

MIB = 1 << 20
# Transformer Engine's get_cublas_workspace_size_bytes: 32 MiB + 1,024 B where the device's compute
# capability major is 9 or more (Hopper, Blackwell), 4 MiB before; one per device, cached
# (transformer_engine/pytorch/cpp_extensions/gemm.py 34-60, TransformerEngine f8a01cd5 (2026-05-29),
# the revision Megatron-LM 6e091e1b's pyproject.toml pins)
TE_WORKSPACE_SM90_BYTES = 32 * MIB + 1024
TE_WORKSPACE_BEFORE_SM90_BYTES = 4 * MIB
# torch's cuBLAS handles are per thread (a thread_local PoolWindow reserves each thread its own) and each
# (handle, stream) pair gets a workspace of its own from the caching allocator (aten/src/ATen/cuda/
# CublasHandlePool.cpp getCurrentCUDABlasHandle, setWorkspaceForHandle, pytorch 26a39059); the forward's matmuls
# run on the thread that calls the model, the backward's on autograd's thread for the device (torch/csrc/autograd/
# engine.cpp thread_init, "Note [Allocating GPUs to autograd threads]": one thread for CPU work and one per CUDA
# device). Megatron-LM's output layer (ColumnParallelLinear, torch.matmul) runs in both on the last rank: two.
TORCH_BLAS_THREADS = 2
# ckplan's GPUs of compute capability 9.0 or later (H100, H200, GH200: 9.0; B200, GB200: 10.0;
# NVIDIA's CUDA GPUs compute capability table)
_SM90_PLUS = ("h100", "h200", "gh200", "b200", "gb200")


def kept_inputs_bytes(first_layers: Sequence[LayerCost], stages: Sequence[int],
                      record: runtimes.RuntimeFacts) -> int:
    """The last microbatch's input and its gradient per chunk past the pipeline's first stage
    (`first_layers[i]` opens pipeline stage `stages[i]`), where the runtime keeps them."""
    if not record.keeps_last_input_and_grad:
        return 0
    return sum(2 * layer.input_bytes for layer, stage in zip(first_layers, stages) if stage > 0)


def torch_workspaces(record: runtimes.RuntimeFacts) -> tuple[int, ...]:
    """torch's own cuBLAS workspaces, each `cublas_workspace_bytes`: one per thread that runs matmuls."""
    return (record.cublas_workspace_bytes,) * TORCH_BLAS_THREADS if record.cublas_workspace_bytes else ()


def workspace_bytes(record: runtimes.RuntimeFacts, device: DeviceInfo, training: TrainingSetup | None = None,
                    comm: CommSetup | None = None) -> int:
    """The cuBLAS workspaces the runtime allocates once through the caching allocator (cuda); with the
    setup's `training` part, none of Transformer Engine's where it runs Megatron-core's local spec (whose
    layers make no TE GEMM), and TE's grouped-GEMM workspaces too where it runs that GEMM; with its `comm`
    part too, TE's userbuffers' workspace where it runs them."""
    if device.type != "cuda":
        return 0
    return sum(torch_workspaces(record)) + sum(te_workspaces(record, device, training, comm))


def te_workspaces(record: runtimes.RuntimeFacts, device: DeviceInfo, training: TrainingSetup | None = None,
                  comm: CommSetup | None = None) -> tuple[int, ...]:
    """Transformer Engine's cuBLAS workspaces, each its own allocation: the plain one, where the setup runs TE's
    grouped GEMM one per compute stream it spreads the experts' GEMMs over, and where it runs TE's userbuffers
    (`comm`'s tp_overlap) the overlapped GEMMs' one (te_userbuffers.workspace_bytes); none where the record has
    no TE workspace or the setup runs Megatron-core's local spec."""
    if not record.te_cublas_workspace or (training is not None and local_spec(training)):
        return ()
    sm90 = any(kind in device.name.lower() for kind in _SM90_PLUS)  # "h100-sxm (analytic)", "NVIDIA H100 80GB HBM3"
    te = TE_WORKSPACE_SM90_BYTES if sm90 else TE_WORKSPACE_BEFORE_SM90_BYTES
    grouped = record.te_grouped_gemm_workspaces if getattr(training, "te_grouped_gemm", False) else 0
    overlapped = te_userbuffers.workspace_bytes(te, comm, training) if training is not None else 0
    plain = 1 if not overlapped or record.te_ub_keeps_plain_workspace else 0  # TE v2.9: the 3x in its place
    return (te,) * (plain + grouped) + ((overlapped,) if overlapped else ())


def local_spec(training: TrainingSetup) -> bool:
    """Whether the setup runs Megatron-core's local spec (--local-layers, where the record reads it)."""
    return getattr(training, "local_layers", False) and runtimes.of(training).local_spec_buffer


def holds_last_stage(rank: int | None, pipeline) -> bool:
    """Whether pipeline rank `rank` holds the last stage, so the output layer (None: not a rank's question, e.g.
    what every rank keeps): the last rank, rank 0 under a V-placed schedule (schedules._V_PLACED: ZBV, DualPipeV
    put the last stage beside the first)."""
    if rank is None:
        return False
    return rank == (0 if pipeline.schedule in ("ZBV", "DualPipeV") else pipeline.stages - 1)


def global_buffer_bytes(training: TrainingSetup, profile: Profile, *, holds_output: bool = False) -> int:
    """Megatron-core's global memory buffer (one tensor a name and dtype, made again only larger, never freed,
    utils.py GlobalMemoryBuffer). Under its local spec (the record's local_spec_buffer) every rank's blocks make
    it: DotProductAttention's baddbmm input, micro-batch x heads / TP x s x s, and under sequence parallelism at
    TP > 1 the linears' all-gathered input, s / CP x micro-batch x hidden, share the name "mpu": the larger, in
    the activations' dtype (a rank without a decoder block would not: not told apart). Under every spec (the
    record's output_layer_buffer) the rank holding the output layer (`holds_output`) makes the gathered one under
    sequence parallelism at TP > 1: the output layer is megatron-core's own ColumnParallelLinear. 0 elsewhere,
    or where the profile is not of a cuda device (torch.empty on torch.cuda.current_device(), utils.py 746-751)."""
    if profile.device.type != "cuda":
        return 0
    record = runtimes.of(training)
    local = local_spec(training)
    shape = profile.assumptions
    gathers = int(shape.get("tp", 1)) > 1 and bool(shape.get("sp"))
    if not local and not (holds_output and gathers and record.output_layer_buffer):
        return 0
    model = shape.get("model") or {}
    if not {"seq_len", "micro_batch_size", "dtype"} <= set(shape) or not {"num_heads", "hidden_size"} <= set(model):
        what = ("--local-layers sizes the local spec's attention buffer" if local else
                "Megatron-core's output layer under sequence parallelism keeps its gathered input, sized")
        raise UserError(f"{what} from the profile's heads, sequence and micro-batch, which this profile does not "
                        "record: profile the model with --arch or read it with --from-megatron")
    if local and shape.get("attention", "eager") != "eager":  # DotProductAttention makes and keeps the s x s scores
        raise UserError("--local-layers runs the local spec's DotProductAttention, which keeps the s x s scores, and "
                        "this profile's attention is flash: profile it with --attention eager (--from-megatron "
                        "reads --transformer-impl local so)")
    tp, seq, mbs = int(shape.get("tp", 1)), int(shape["seq_len"]), int(shape["micro_batch_size"])
    scores = mbs * int(model["num_heads"]) // tp * seq * seq if local else 0
    gathered = seq // int(shape.get("cp", 1) or 1) * mbs * int(model["hidden_size"]) if gathers else 0
    return max(scores, gathered) * DTYPE_BYTES[shape["dtype"]]


def first_forward_bytes(training: TrainingSetup, profile: Profile, comm: CommSetup | None = None, *,
                        holds_output: bool = False) -> int:
    """What the runtime makes at its first forward and keeps to the end: the cuBLAS workspaces
    (workspace_bytes; with `comm`, TE's userbuffers' too) and Megatron-core's global buffer (global_buffer_bytes;
    `holds_output`: on the rank holding the output layer)."""
    record = runtimes.of(training)
    return workspace_bytes(record, profile.device, training, comm) \
        + global_buffer_bytes(training, profile, holds_output=holds_output)


def after_step_bytes(static: float, first_layers: Sequence[LayerCost], stages: Sequence[int], *,
                     training: TrainingSetup, profile: Profile, comm: CommSetup | None = None,
                     holds_output: bool = False, step_copy_bytes: float = 0.0) -> int:
    """Allocated after the optimizer step on a rank holding pipeline `stages` (their first layers
    `first_layers`; `holds_output`: the last stage among them): its static bytes and what its runtime keeps past
    the step (`comm`: the setup's, for TE's userbuffers' workspace; `step_copy_bytes`: the step's fp32 copy of
    16-bit gradients, bridgeterms.step_grad_copy_bytes, held to the next zero_grad)."""
    record = runtimes.of(training)
    return int(round(static + step_copy_bytes)) + kept_inputs_bytes(first_layers, stages, record) \
        + first_forward_bytes(training, profile, comm, holds_output=holds_output)
