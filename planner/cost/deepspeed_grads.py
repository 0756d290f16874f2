"""DeepSpeed ZeRO 3's gradient hooks, every microbatch, in place of the profile's `.grad` accumulation
(docs/framework-facts.md §369-§371; read at DeepSpeed v0.6.2, 32d97976, the version the Azure rows ran, whose other
ZeRO 3 step facts the record carries: planner/cost/runtime_deepspeed.py).

The analytic profile's backward adds every parameter's new gradient into its `.grad` (fsdp2work.PROFILE_ACCUMULATE
x the gradient's bytes: read both, write one, at the profile's elementwise rate). Under ZeRO 3 `.grad` is None at
every backward: the hook on each parameter's AccumulateGrad takes the gradient autograd stored (no kernel) and, after
its reduce-scatter, sets `param.grad = None` (stage3.py 1427-1455, the hook 1444-1447; 1710), so that add never runs. What runs
instead, a parameter a microbatch:

- the bucket copy: a gradient of fewer elements than reduce_bucket_size is copied into the contiguous bucket
  (`__add_grad_to_ipg_bucket` 1493-1511: 1496-1505, contiguous_gradients on by default, zero/constants.py 64-65:
  read and write the gradient); a larger
  one is reduce-scattered from where autograd left it (no copy);
- the partition's move (`__partition_grads` 1643-1710), over the rank's 1/K of it: copied into the gradient partition
  at the first microbatch of a step (`micro_step_id == 0`, 1657-1658: read 1, write 1), added into it after (1663: read 2, write 1);
  then the record's `partition_check_bytes`: v0.6.2 tests each partition for inf and NaN there (`torch.isinf(...)
  .any()`, `torch.isnan(...).any()`, 1676-1677: each reads the partition and writes, then reads, a bool per element).

Under the optimizer's offload, at the step's last microbatch, each partition's fp64 norm (offload_norm_ms, once a
step). The pre-divide before the reduce-scatter is deepspeed_step.prepass_ms; the reduce-scatter itself dataparallel's; the
offloaded copy to the host deepspeed_waits'. Charged at the profile's elementwise rate (hpgrads.elementwise_tbps),
net of the profile's accumulation: the term is negative, and a layer's busy time stays its backward's less its own
accumulation, above 0. Only where the profile timed that accumulation (jobsettings.accumulation_timed: a measured or
fake profile runs its backward into a `.grad` made before it, an analytic one times it by its roofline, not under
--mfu) and names an elementwise rate to take it off at.
"""

from __future__ import annotations

from planner.cost import dataparallel, deepspeed_terms, jobsettings, runtimes
from planner.cost.fsdp2work import PROFILE_ACCUMULATE
from planner.cost.hpgrads import elementwise_tbps
from planner.cost.layers import LayerCost
from planner.schema import Profile, TrainSetup

BUCKET_COPY = 2  # new_grad_tensor.copy_(param.grad): read the gradient, write its slot of the bucket
PARTITION_COPY = 2  # grad_buffer.copy_(grad_partition): read, write
PARTITION_ADD = 3  # grad_buffer.add_(grad_partition): read both, write one
FP64_BYTES = 8  # part.data.double(): the partition cast to fp64


def takes_accumulation_off(profile: Profile, setup: TrainSetup) -> bool:
    """Whether hooks_ms takes the profile's `.grad` accumulation off: ZeRO 3's coordinator runs (its hooks set
    `.grad` to None), the profile timed that accumulation (jobsettings.accumulation_timed) and names the elementwise
    rate it is taken off at."""
    return (deepspeed_terms.runs_zero3(setup) and jobsettings.accumulation_timed(profile)
            and elementwise_tbps(profile) is not None)


def bucket_copied_count(layer: LayerCost, profile: Profile, setup: TrainSetup) -> int:
    """Elements of the layer's gradients ZeRO 3 copies into its bucket (tensors under reduce_bucket_size): a known
    block's by its submodules (deepspeed_terms.profile_block); another layer's as one tensor of its own parameters
    (an embedding's position table, under the bucket beside a word table over it, is left out: 4 B an element)."""
    bucket = setup.data_parallel.reduce_bucket_size
    bucket = deepspeed_terms.REDUCE_BUCKET_DEFAULT if bucket is None else bucket
    block = deepspeed_terms.profile_block(profile, layer)
    numels = [n for module in block for n in module.param_numels] if block else [layer.param_count - layer.shared_before]
    return sum(n for n in numels if n < bucket)


def partition_bytes(layer: LayerCost, profile: Profile, setup: TrainSetup) -> float:
    """Bytes a microbatch the partition's move and checks take over the rank's 1/K of the layer's own parameters (a
    tied head's weight is the embedding's: reduced once, deepspeed_step.own_param_count), averaged over the step's microbatches (a copy at the first, an add at each later one)."""
    microbatches, grads = setup.pipeline.microbatches, dataparallel.param_bytes(setup).grads
    move = grads * (PARTITION_COPY + (microbatches - 1) * PARTITION_ADD) / microbatches
    checks = runtimes.of(setup.training).partition_check_bytes
    return (layer.param_count - layer.shared_before) / dataparallel.shard_size(setup) * (move + checks)


def hooks_ms(layer: LayerCost, profile: Profile, setup: TrainSetup) -> float:
    """ms per microbatch ZeRO 3's gradient hooks move for the layer beyond the profile's backward: the bucket copy and
    the partition's move and checks, less the `.grad` accumulation the profile charged every one of the layer's
    parameters (a tied head's too: its share is the tied add, tiedadd.py); 0 where the coordinator does not run, the
    profile timed no accumulation or names no elementwise rate."""
    tbps = elementwise_tbps(profile)
    if not takes_accumulation_off(profile, setup) or tbps is None:
        return 0.0
    weights = dataparallel.param_bytes(setup).weights
    unrun = PROFILE_ACCUMULATE * weights * layer.param_count
    copied = BUCKET_COPY * weights * bucket_copied_count(layer, profile, setup)
    moved = copied + partition_bytes(layer, profile, setup) - unrun
    return moved / (tbps * 1e12) * 1e3


def offload_norm_ms(layer: LayerCost, profile: Profile, setup: TrainSetup) -> float:
    """ms once a step of the fp64 norm ZeRO 3 takes of each gradient partition at the accumulation boundary under the
    optimizer's offload (docs/framework-facts.md §413): `_constant_buffered_norm2` casts the rank's 1/K of each
    parameter to fp64 (read the gradient's dtype, write 8 B) and takes its 2-norm (read 8 B), at the profile's
    elementwise rate; 0 where the record's offloaded partition path is not read (waits_offloaded_grad_copy), ZeRO 3's
    coordinator does not run, the optimizer stays on the GPU, or the profile names no rate."""
    tbps = elementwise_tbps(profile)
    if not (setup.data_parallel.offload and runtimes.of(setup.training).waits_offloaded_grad_copy
            and deepspeed_terms.runs_zero3(setup)) or tbps is None:
        return 0.0
    per_element = dataparallel.param_bytes(setup).grads + FP64_BYTES + FP64_BYTES
    moved = (layer.param_count - layer.shared_before) / dataparallel.shard_size(setup) * per_element
    return moved / (tbps * 1e12) * 1e3


# the rows planner/cost/terms.py adds to its TERMS (name, quantity, where, value, source)
ROWS = (
    ("ZeRO 3's gradient hooks in place of the profile's .grad accumulation", "time", "layer",
     lambda layer, ckpt, ctx: hooks_ms(layer, ctx.profile, ctx.setup),
     "DeepSpeed v0.6.2 stage3.py: each gradient copied into the bucket under reduce_bucket_size, its partition copied "
     "or added and checked for inf/NaN (the record's partition_check_bytes), .grad set to None so autograd never adds; "
     "less the profile's accumulation, at the profile's elementwise rate (planner/cost/deepspeed_grads.py, §369-§371)"),
    ("ZeRO 3's fp64 norm of each gradient partition at the step's boundary under the optimizer's offload", "step",
     "layer", lambda layer, ckpt, ctx: offload_norm_ms(layer, ctx.profile, ctx.setup),
     "DeepSpeed v0.6.2 stage3.py 1690-1692 (__partition_grads under offload_optimizer, is_gradient_accumulation_"
     "boundary), 1591-1598 (_constant_buffered_norm2: part.data.double().norm(2)): read 2, write 8, read 8 B over "
     "the rank's partition, at the profile's elementwise rate (§413)"),
)
