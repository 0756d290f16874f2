"""DeepSpeed's activation checkpointing as its CheckpointFunction runs a whole-layer checkpoint (framework-facts §133;
deepspeed/runtime/activation_checkpointing/checkpointing.py at v0.6.2, the Azure runs' version, the same to v0.6.7).

A layer under ckplan's `full` option is DeepSpeed's reentrant checkpoint under `--runtime deepspeed`; its kept bytes
are the layer's input (hidden states, s x b x h in the training dtype: Megatron-DeepSpeed's _checkpointed_forward
hands it the hidden states and a bool mask, which `is_activation_to_checkpoint` skips: not floating point).

- cpu_checkpointing (`checkpoint_in_cpu`): the forward copies the input to the host with `copy_to_device(args,
  cpu)`, `tensor.to('cpu')` (564-598): pageable host memory, a blocking copy on the compute stream (the
  `transport_stream` it creates is never used: its `with torch.cuda.stream(...)` lines are comments), then points the
  argument at the host copy (`arg.data = inp.data`), so the GPU keeps none of it. The backward brings it back with
  `move_to_device(..., cuda_device)` (`tensor.to(cuda)`, again blocking on the compute stream) before the rerun, and
  it lives on the GPU through the layer's rerun and backward. Charged: the kept bytes leave the GPU for the host
  (`offloaded`), the layer's backward holds them again (`extra`), and both copies at the host link's rate, on the
  critical path (`time`).
- partition_activations: each checkpoint is split over the tensor-parallel group (`mp_size`, 243-257) and
  all-gathered before the rerun (259-300). ckplan scores DeepSpeed at tensor parallelism 1, where `mp_size` is 1: the
  "partition" is the whole input cloned, nothing is split or gathered; its clone in the forward and its copy into a
  zeroed buffer before the rerun are device copies of the input, not charged (two HBM passes over s·b·h·2 B a layer).
  With cpu_checkpointing the clone goes to the host (`partition.cpu()`, or a `copy_` into the host buffer), as above.
- contiguous_memory_optimization (`contiguous_checkpointing`, which DeepSpeed asserts only with partitioning):
  `number_checkpoints` separate buffers of one partition each (`new_empty` in a list, 387-404), on the host under
  cpu_checkpointing, each filled by one layer's checkpoint; the list is dropped at the first backward (637-647), so a
  buffer no layer filled is freed before the backward's peak. Each checkpointed layer's bytes are as above.
- synchronize_checkpoint_boundary (`synchronize_each_layer`): `torch.cuda.synchronize()` at each checkpoint's
  forward and backward start and end: the host waits for the GPU; the GPU's time is unchanged (its queue is drained
  and refilled: not charged).
"""

from __future__ import annotations

from planner.cost import dataparallel
from planner.cost.layers import LayerCost
from planner.errors import UserError
from planner.schema import Profile, TrainSetup


def in_cpu(layer: LayerCost, option: int, setup: TrainSetup) -> bool:
    """Whether the layer's checkpoint goes to the host: cpu_checkpointing (a DeepSpeed setting: the CLI refuses it
    under any other runtime, planner/commands/deepspeed_options.py), the layer under DeepSpeed's whole-layer
    checkpoint (`full`), its input floating point (not an embedding's token ids, which `is_activation_to_checkpoint`
    leaves where they are)."""
    return (setup.data_parallel.checkpoint_in_cpu and layer.options[option].name == "full"
            and layer.kind != "embedding")


def host_checkpoint_bytes(layer: LayerCost, option: int, setup: TrainSetup) -> int:
    """The layer's checkpoint (its full option's kept bytes, the input) in host memory per microbatch until its
    backward; 0 where it stays on the GPU."""
    return layer.options[option].kept_bytes if in_cpu(layer, option, setup) else 0


def pageable_rates(profile: Profile | None) -> tuple[float, float]:
    """(h2d, d2h) GB/s one GPU of the profile's server moves to and from pageable host memory (archs.GPU's
    pageable_*_gb_per_s: bandwidthTest --memory=pageable; framework-facts §578), 0 where not read or no GPU is known."""
    try:
        gpu = dataparallel.profile_gpu(profile) if profile is not None else None
    except UserError:
        return 0.0, 0.0
    return (gpu.pageable_h2d_gb_per_s, gpu.pageable_d2h_gb_per_s) if gpu else (0.0, 0.0)


def copies_ms(layer: LayerCost, option: int, setup: TrainSetup, profile: Profile | None = None) -> float:
    """The checkpoint's copy to the host in the forward and back before the rerun, per microbatch, each blocking on
    the compute stream (`tensor.to(device)`): both on the critical path. Each at the host link's rate (the GPU record's
    host_link_gb_per_s shared as links.default_links shares it, or --host-bandwidth), but no faster than the
    profile's GPU moves pageable memory in that direction (the copies are to and from pageable tensors, §133;
    pageable_rates, §578); 0 where the checkpoint stays, or no host link is set (a cpu profile)."""
    gb_per_s = setup.data_parallel.host_gb_per_s
    moved = host_checkpoint_bytes(layer, option, setup)
    if not gb_per_s or not moved:
        return 0.0
    h2d, d2h = (min(gb_per_s, cap) if cap else gb_per_s for cap in pageable_rates(profile))
    return (moved / (d2h * 1e9) + moved / (h2d * 1e9)) * 1e3


# the rows planner/cost/terms.py adds to its TERMS (name, quantity, where, value, source)
ROWS = (
    ("DeepSpeed's checkpoints copied to the host (cpu_checkpointing), off the GPU", "kept", "layer",
     lambda layer, ckpt, ctx: -host_checkpoint_bytes(layer, int(ckpt), ctx.setup),
     "checkpointing.py 564-598 (DeepSpeed v0.6.2): copy_to_device(args, cpu), arg.data = the host copy (§133)"),
    ("DeepSpeed's checkpoints on the host (cpu_checkpointing)", "offloaded", "layer",
     lambda layer, ckpt, ctx: host_checkpoint_bytes(layer, int(ckpt), ctx.setup),
     "checkpointing.py 564-598 (DeepSpeed v0.6.2): pageable host tensors, one a checkpointed layer (§133)"),
    ("DeepSpeed's checkpoint brought back to the GPU for the layer's rerun and backward", "extra", "layer",
     lambda layer, ckpt, ctx: host_checkpoint_bytes(layer, int(ckpt), ctx.setup),
     "checkpointing.py 662-666 (DeepSpeed v0.6.2): move_to_device(saved, cuda_device) before the rerun (§133)"),
    ("DeepSpeed's checkpoint copies to the host and back, blocking the compute stream", "time", "layer",
     lambda layer, ckpt, ctx: copies_ms(layer, int(ckpt), ctx.setup, ctx.profile),
     "tensor.to(cpu) / .to(cuda) on the current stream (checkpointing.py v0.6.2; runtime/utils.py 122-169), at the "
     "GPU record's host link rate, no faster than its server's pageable copies each way (§133, §578)"),
)
