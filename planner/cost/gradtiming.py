"""When a stage's whole gradients exist: from its first backward to its last, where the runtime's
record says so (grads_allocated_at_first_backward), rather than all iteration.

torchtitan beside a pipeline keeps each FSDP2 module's gradient unsharded in fp32 between
microbatches: FSDP2's post-backward creates `unsharded_accumulated_grad` (reduce_dtype) at the
module's first backward of the step and frees it once the last backward's reduce-scatter has run
(torch 2.13 torch/distributed/fsdp/_fully_shard/_fsdp_param.py 802-820, _fsdp_param_group.py
605-611; the pipeline stage turns gradient sync off until then, pipelining/stage.py 844-847). So at
the step's activation peak (the last forward of the warm-up, before the stage's first backward) a
stage holds its activations but not those gradients, and once it holds the gradients it has freed
at least one microbatch's activations. Megatron-LM's main_grad buffers, allocated once at start,
are held all iteration (its record says False).

That last backward is the stage's own, not the step's: torch's schedules count each stage's
backwards and call the stage's FSDP2 post-backward (the reduce-scatter, whose copy-in drops the
accumulated gradients: foreach_reduce's `unsharded_grads.clear()`) at its M-th, B or W (torch 2.6.0,
the release of torchtitan 9dec370's torch 1963fc8: pipelining/schedules.py 1259-1266 and 1279-1286
PipelineScheduleMulti's backward_counter, stage.py 636-652 backward_maybe_with_nosync's
last_backward, fsdp/_fully_shard/_fsdp_param_group.py 388-437 post_backward,
_fsdp_collectives.py foreach_reduce; torch 2.13: a REDUCE_GRAD action after the stage's M-th B or W,
schedules.py 1262-1282, stage.py 1164-1191). Under one stage a rank that is the rank's last action;
a rank of several chunks frees a chunk's gradients while the others still run.

A stage's peak is then static - G + buffers + max over its actions (activations + the gradients
allocated so far) + transient, where static (bytes_per_param) charges G all iteration:
    one stage a rank (1F1B, GPipe), A microbatches in flight of k bytes, M microbatches:
        1F1B with A < M: a forward follows the first backward, A in flight again beside G: A k + G
        otherwise (GPipe; 1F1B's stage 0 when A = M): max(A k, (A - 1) k + G), and under GPipe, where each
        backward leaves h held to the step's end (gpipeheld), its second's and last's (A - 1) k + h + G, k + (A - 1) h + G
    several stages a rank (interleaved): at every moment of torch's action order, chunk c's G_c
        counted from its first backward until its last (schedules.rank_peak, ChunkBytes.late_grad;
        the chunked MILP's rows count them at the same moments: planner/solve/milp_ranks.py).
This is the term that orders LLaMA 3.1 405B's interleaved 1F1B below its 1F1B (torchtitan's
Table 5): every rank runs all its chunks' forwards before a backward, each chunk's gradients
arrive only as the other chunk's activations leave, and the later chunk's leave at its last
backward, before the earlier chunk's arrive; a 1F1B rank holds its stage's from its first backward
to the step's last.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.cost import dataparallel, runtimes
from planner.cost.layers import LayerCost
from planner.schema import TrainSetup


def lazy_grad_bytes(layers: Sequence[LayerCost], setup: TrainSetup) -> float:
    """The stage's whole gradients the runtime allocates at its first backward (0 where they are
    held all iteration, or sharded per microbatch)."""
    if not runtimes.of(setup.training).grads_allocated_at_first_backward or not dataparallel.kept_whole(setup):
        return 0.0
    grads = dataparallel.param_bytes(setup).grads
    ep = setup.data_parallel.ep
    return grads * sum(layer.param_count - layer.expert_param_count + layer.expert_param_count / ep for layer in layers)


def one_chunk(lazy: float, *, in_flight: int, kept, microbatches: int, steady: bool, maximum=max,
              per_backward: float = 0.0):
    """The bytes above in_flight x kept that the stage's activations and lazily allocated
    gradients reach together (see the module docstring); `steady`: 1F1B, whose forwards go on
    after the first backward. `per_backward`: what each GPipe backward leaves held to the step's end
    (gpipeheld.held_per_backward_bytes, h): with all M in flight, the j-th backward (0-based) holds
    (M - j)·kept + j·h, and from the first on the whole gradients: above M·kept, max(0, lazy - kept
    at the first, lazy - kept + h at the second, lazy + (M - 1)·(h - kept) at the last; linear in j
    between). `maximum=np.maximum` answers for many `kept` at once (the DP)."""
    if not lazy and not per_backward:
        return 0.0
    if steady and in_flight < microbatches:
        return lazy
    first = maximum(0.0, lazy - kept) if in_flight else lazy
    if not per_backward or microbatches < 2:
        return first
    return maximum(first, maximum(lazy - kept + per_backward, lazy + (microbatches - 1) * (per_backward - kept)))


def layer_grad_in_flight_bytes(layer: LayerCost, setup: TrainSetup) -> float:
    """While `layer` runs its backward beside a pipeline, its gradients as autograd makes them, in
    the weights' dtype, beside the whole gradients the stage keeps (lazy_grad_bytes): FSDP2 with
    gradient sync off adds them into `unsharded_accumulated_grad` (reduce dtype; made from them at
    the first backward) only in the unit's post-backward, which runs once the gradient of the unit's
    input is computed, after every weight gradient of the unit (torch 2.6.0 fsdp/_fully_shard/
    _fsdp_param_group.py 374-390 post_backward, _fsdp_param.py 629-648
    to_accumulated_grad_if_needed / accumulate_unsharded_grad_if_needed, 699-719
    RegisterPostBackwardFunction on the unit's inputs; pipelining/stage.py 636-641 turns sync off).
    torchtitan fully_shards each block: the unit is the layer. 0 where the record keeps its
    gradients all iteration (grads_allocated_at_first_backward False) or they are not kept whole."""
    if not runtimes.of(setup.training).grads_allocated_at_first_backward or not dataparallel.kept_whole(setup):
        return 0.0
    ep = setup.data_parallel.ep
    held = layer.param_count - layer.expert_param_count + layer.expert_param_count / ep
    return held * dataparallel.param_bytes(setup).weights
