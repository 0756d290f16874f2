"""Megatron-FSDP (Megatron-LM's --use-megatron-fsdp under --data-parallel-sharding-strategy optim_grads_params,
ckplan's ZeRO 3 on the megatron record) as its code holds memory beyond the sharded state, read at megatron-core
92c8482e (2025-12-01), the Megatron-LM Megatron-Bridge 25.11 (00b7660b) pins (docs/framework-facts.md §114).
F = megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py, B = its param_and_grad_buffer.py.

- units: every TransformerLayer (megatron/core/distributed/fsdp/mcore_fsdp_adapter.py 95-97), a profile's
  decoder and MoE blocks. The other modules (the embedding, the final norm, the output layer) are gathered in
  their own forward pre-hook (F 597-625, their own parameters) and only units are ever marked releasable
  (F 750-757, B 3348-3365): they stay gathered from the iteration's first forward until finish_grad_sync resets
  the all-gather pipeline before the step (F 1044-1064, B 3127-3145): held whole through the microbatches.
- the units gathered at once: under --fsdp-double-buffer two slots of a unit's buckets (B 1791-1800,
  FixedPoolAllocator 639-790, UB_BUFFER_NUM 2), named tensors of Megatron's GlobalMemoryBuffer, which keeps
  each (name, dtype) for the run (megatron/core/utils.py 598-616): two units' weights and, in two more slots,
  two units' gradient buckets, allocated at the first use and never freed; the names carry no model chunk,
  so interleaved chunks share them. Without it the unit computing and the units its prefetch adds (B 3155-3265:
  next units while what it added is under suggested_communication_unit_size // 2 elements; F 358-383: the size
  defaults to max(1e9, 2 x the mean unit's parameters)), each freed in its unit's post-forward and
  post-backward (F 490-504, 561, 780). Float8 weights are gathered at 1 B (uint8 buffers, B 1843-1848).
- gradients: each unit's in one whole-unit bucket in the reduce dtype (bf16 under --grad-reduce-in-bf16, Float8
  weights' too; fp32 otherwise: B 1843-1848, 1903), fetched in the unit's post-backward (F 506-548) and freed
  when the reduce queue passes suggested_communication_unit_size elements (B 2815-2848); the output layer's
  likewise, reduced before the first unit's. Under --no-gradient-accumulation-fusion autograd makes each
  weight's bf16 gradient and the post-backward copies it into the bucket (F 526-532): the unit's whole bf16
  gradients beside its bucket; fused, the linears write into the bucket (tensor_parallel/layers.py 566-569).
- Transformer Engine's FP8 transpose (Hopper, TN-only GEMMs: bridgesettings.TN_ONLY_GPUS): made in the unit's
  forward and backward and dropped after (F 498-504, keep_fp8_transpose_cache off): the computing unit's.

Charged (buffer_bytes) as a stage constant for the model's largest unit: the edge modules the stage holds gathered
and, under the double buffer, its slots — what is held all iteration; the moments (the output layer's bucket and
bf16 gradient, a unit's bf16 gradients and transpose) are then the layers' extras, each at its own instant of the
backward (megatron_fsdp_moments.py; docs/framework-facts.md §146). Without the double buffer (not replayed) the
constant keeps the larger of two moments: the output layer's post-backward (its bucket, and its bf16 gradient
unfused) and the first unit's post-backward (the output's bucket still queued, the unit's weights gathered with
its prefetch and its bucket, its bf16 gradients unfused, its transpose on Hopper). The sharded state is bytes_per_param's,
its Float8 weights' shard at 1 B (fp8_shard_saving_bytes). Not read: the buckets' padding to a multiple of the
ranks x the group's row length (B 249-378: under 0.5% at the Bridge rows' shapes), modules between the units
(none in a GPT model), HSDP's outer buffers. ZeRO 2 (optim_grads) and 1 (optim) are not read here
(megatron_ddp.py notes it)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from planner.cost import dataparallel, runtimes
from planner.cost.bridgesettings import TN_ONLY_GPUS
from planner.schema import Profile, TrainSetup

UNIT_KINDS = ("decoder_block", "moe_block")  # Megatron-core's TransformerLayer (mcore_fsdp_adapter.py 95-97)
COMM_UNIT_FLOOR = 1_000_000_000  # F 377-380: max(1e9, the default size)
DOUBLE_BUFFER_SLOTS = 2  # B 1793: UB_BUFFER_NUM


def runs(setup: TrainSetup) -> bool:
    """Megatron-FSDP's ZeRO 3 over 2 or more ranks under a record that says it (fsdp_units "megatron-fsdp")."""
    return (runtimes.of(setup.training).fsdp_units == "megatron-fsdp" and setup.data_parallel.zero >= 3
            and dataparallel.shard_size(setup) > 1 and not dataparallel.kept_whole(setup))


def step_replayed(setup: TrainSetup) -> bool:
    """Whether the caching allocator's replay orders this Megatron-FSDP step (reserve_megatron_fsdp.py): the record
    replays Megatron-LM's step, Megatron-FSDP runs with --fsdp-double-buffer, one pipeline stage and one chunk."""
    pipeline = setup.pipeline
    return (runtimes.of(setup.training).megatron_step_replayed and runs(setup)
            and setup.data_parallel.fsdp_double_buffer and pipeline.stages == 1 and pipeline.chunks == 1)


def held(profile: Profile, setup: TrainSetup) -> list[tuple[int, int, bool]]:
    """Each layer's (parameters a rank holds, Float8 weights among them, whether it is a unit): 1/E of the
    routed experts; every layer a unit where the profile has no blocks."""
    ep = setup.data_parallel.ep
    blocks = any(layer.kind in UNIT_KINDS for layer in profile.layers)
    return [(layer.param_count - layer.expert_param_count + layer.expert_param_count // ep,
             layer.float8.param_count if layer.float8 is not None else 0,
             not blocks or layer.kind in UNIT_KINDS) for layer in profile.layers]


def comm_unit_elements(unit_params: Sequence[int], setup: TrainSetup) -> int:
    """suggested_communication_unit_size: given, or max(1e9, 2 x the units' mean parameters) (F 358-380)."""
    given = setup.data_parallel.suggested_communication_unit_size
    if given is not None:
        return given
    return max(COMM_UNIT_FLOOR, sum(unit_params) // len(unit_params) * 2)


def gathered_units(unit_params: Sequence[int], setup: TrainSetup) -> int:
    """Units gathered at once without double buffers: the computing one and those the prefetch adds while
    what it added is under half the communication unit (B 3239-3265), the largest unit's size each."""
    prefetch = comm_unit_elements(unit_params, setup) // 2
    return min(len(unit_params), 1 + math.ceil(prefetch / max(unit_params)))


def _edges(layers: list[tuple[int, int, bool]], stage: int, setup: TrainSetup) -> tuple[list, list]:
    """The non-unit layers before the first unit (the first stage's) and after the last (the last stage's)."""
    units = [i for i, (_, _, unit) in enumerate(layers) if unit]
    first = layers[:units[0]] if stage == 0 else []
    last = layers[units[-1] + 1:] if stage == setup.pipeline.stages - 1 else []
    return first, last


def buffer_bytes(profile: Profile, stage: int, setup: TrainSetup) -> float:
    """What Megatron-FSDP holds on the stage beyond the sharded state all iteration (the double buffer) or at its
    backward's start (without it; the module's docstring); 0 where it does not run."""
    if not runs(setup):
        return 0.0
    layers = held(profile, setup)
    units = [(p, f) for p, f, unit in layers if unit]
    unit_params, unit_fp8 = max(units)
    params = dataparallel.param_bytes(setup)
    unit_weights = dataparallel.gathered_bytes(unit_params, setup, fp8_count=unit_fp8)
    unit_bucket = unit_params * params.grads
    unfused = setup.training.unfused_grad_accumulation
    first, last = _edges(layers, stage, setup)
    edge_weights = sum(dataparallel.gathered_bytes(p, setup, fp8_count=f) for p, f, _ in first + last)
    out_bucket = sum(p for p, _, _ in last) * params.grads
    out_grads = sum(p for p, _, _ in last) * params.weights if unfused else 0.0
    if setup.data_parallel.fsdp_double_buffer:  # the moments are the layers' extras (megatron_fsdp_moments.py)
        return edge_weights + DOUBLE_BUFFER_SLOTS * (unit_weights + unit_bucket)
    in_flight = gathered_units([p for p, _ in units], setup) * unit_weights + unit_bucket
    unit_moment = out_bucket + in_flight + (unit_params * params.weights if unfused else 0.0)
    unit_moment += transpose_bytes(unit_fp8, profile, setup)
    return edge_weights + max(out_bucket + out_grads, unit_moment)


def transpose_bytes(fp8_count: int, profile: Profile, setup: TrainSetup) -> float:
    """Transformer Engine's FP8 transpose of the computing unit's Float8 weights, on Hopper (TN-only GEMMs)."""
    record = runtimes.of(setup.training)
    if not (setup.training.float8 and setup.training.fp8_all_gather and record.fp8_param_bytes):
        return 0.0
    return fp8_count * record.fp8_param_transpose_bytes if dataparallel.profile_gpu(profile).name in TN_ONLY_GPUS else 0.0


def fp8_shard_saving_bytes(fp8_count: float, setup: TrainSetup) -> float:
    """What the shard of these Float8 weights saves against bytes_per_param's bf16 shard: held at the record's
    fp8_param_bytes (a uint8 buffer, B 1843-1848) under --fp8-param-gather; 0 where Megatron-FSDP does not run."""
    record = runtimes.of(setup.training)
    if not (runs(setup) and setup.training.float8 and setup.training.fp8_all_gather and record.fp8_param_bytes):
        return 0.0
    shard = dataparallel.param_bytes(setup).shard_weights
    return fp8_count * (shard - record.fp8_param_bytes) / dataparallel.shard_size(setup)
