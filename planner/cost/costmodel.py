"""THE cost model: memory and time of a pipeline plan, from a profile and a setup.

Pure functions, no I/O. Every term is one row of TERMS (below: what it is, which quantity it
adds to, whose numbers it reads, its source), and each quantity declares how it combines
(QUANTITY_DECLARATIONS). One stage accumulator (assembly.stage_sums; the DP grows the same sums
a layer at a time, assembly.StageRun) and one evaluator (score.evaluate) serve every schedule:
each of the pipeline's P·V stages is summed, each rank adds its stages' sums and takes from its
schedule (planner/cost/schedules.py) its chunks' in-flight microbatches at its peak, what its
sends hold and whether its backward splits, and the iteration is the schedule's makespan. 1F1B
and GPipe are the one-chunk case, answered in closed form (k_s below). The MILP's rows are
generated from the same declarations (tests/test_quantities.py holds them to the evaluator), so
every plan (the solvers', each baseline's, every export's rounding) is scored alike and a new
term is one row.

Per stage `s` of `P` with layers S (contiguous) and checkpointed C ⊆ S, `M`
microbatches, `k_s` in-flight microbatches (1F1B: min(P - s, M); GPipe: M):

    static_s     = Σ_S params · (w + g + o)                    bytes per parameter, ZeRO, offload
                   (routed experts under ep E: their 1/E, ZeRO over the dp / E expert-data-parallel ranks)
                   + ZeRO 1: o · max(0, max_S largest tensor - Σ_S params / K)   whole tensors per rank
    kept_s       = Σ_{S∖C} act + Σ_C input                      per microbatch
                   - input_in_act(first)                        the stage input lives in a buffer
                   + output(last)                               the stage output waits in fwd_cache
                   (+ loss_bytes on the last stage)
    buffers_s    = (M + 1) · input(first) [s > 0] + M · output(last) [s < P-1]   PipelineStage's recv
                   + M · batch_input [s = 0]             buffers, and the input gradient being sent
                   + M · batch_target [s = P-1]          the whole batch of targets
                   + FSDP2's for the layer it works on (ZeRO 2/3: gathered weights and
                     buffers, unsharded gradient; largest layer; where the runtime's record
                     names its units, charged per moment in transient instead, fsdpunits.py)
                     + Σ_{S∖first} HSDP ZeRO 3's reduced gradient shards
    transient_s  = max( max_{l∈S} (transient_l                       one layer's scratch, + its
                              + [l∈C]·(act_l - input_l)             recompute when checkpointed,
                              - Σ_{m>l} kept_m)⁺,                   net of what the layers after it
                        loss scratch [last stage] )                 do not hold then; the loss's is
                                                                    gone before any layer's backward
    scratch_s    = the optimizer step's temporaries (Adam: sqrt(v) as a new tensor; on cuda all
                   of the stage's parameters at once, on cpu two of the largest)
    end_s        = what the schedule keeps once the last backward has run: the outputs it holds
                   (torch's output_chunks) and the last stage's torch.cat of them, the sends a
                   rank of several stages holds; less the whole gradients a runtime allocates at
                   the first backward, gone by then (chunked.stage_end_bytes, gradtiming)
    peak_s       = static_s + max(k_s · kept_s + transient_s, scratch_s, end_s) + buffers_s
                   GPipe past the first stage: k_s · kept_s is max(M · kept_s, kept_s + (M - 1) · h_s), h_s
                   the input gradient and loss value each backward leaves held to the step's end (gpipeheld.py)
    cuda:          reserved_s = ⌈peak_s / (1 - f) / 2 MiB⌉ · 2 MiB, the caching allocator's segments at
                   fragmentation f; nccl_s = the communicators' buffers (planner/cost/allocator.py). A stage
                   fits when reserved_s + nccl_s ≤ cap_s, which every solver reads as the allocated
                   peak_s ≤ limit_s (limit_bytes, its exact inverse); cpu: peak_s ≤ cap_s
    host_s       = Σ_S offloaded optimizer state + fp32 master + fp32 gradient (/ K)   ≤ host_mem / ranks a node
                   + k_s · Σ_{offloaded layers} host bytes per microbatch     activation offload
    time_s       = c · (Σ_S (fwd + bwd) + Σ_C recompute (+ loss on the last stage))   c: compute_scale
                   + Σ_{MoE layers} (4 + 2·[l∈C]) · a2a · (E-1)/E / bw_ep    ep E: the tokens' all-to-all
    comm_s       = send(output(last)) [s < P-1] + send(input(first)) [s > 0]      per microbatch: the
                   + 2 · action overhead                     output forward, its gradient back, each
                   send(bytes) = latency + bytes / bandwidth  send by its sender; one forward and one
                                                              backward action of the schedule
    step_s       = Σ_S optimizer step (once per iteration; ZeRO ≥ 1: / shard group; offload: copies
                   + host step) + gradient reduction + weight gathers   (planner/cost/dataparallel.py)
    busy_s       = time_s + comm_s
    T_iter       = max(Σ_s busy_s + (M - 1) · max_s busy_s       the pipeline's critical path,
                         + max_s step_s,                          then the slowest step
                       h · (M · Σ_s busy_s + Σ_s step_s) / C)     C stages compute at once (C = P
                                                                  with a device each; fewer when
                                                                  ranks share CPU cores), h: cpu_sharing

Same-kind layers (structurally identical) share one set of numbers: times are the
kind's mean (averaging away timing noise), bytes the kind's maximum. Measured
refinements over DESIGN.md's version 1, each from a run that disagreed: the
receive buffers PipelineStage allocates for every microbatch, the stage output kept
per in-flight microbatch, the stage input shared with a buffer (received, or a slice
of the batch), the input gradient held by its send, the whole target batch on the
last stage, the recompute extra net of what the stage's later layers already freed,
the loss's scratch (which never meets a recompute), a layer's transient net of the
later layers' kept bytes too (the embedding's weight gradient at the end of stage 0's
backward meets only the other microbatches' activations), the optimizer step's
scratch (the peak of a stage with a large embedding and few activations), the capacity bound when
ranks share cores, the optimizer step, and the recompute as measured (less than a
whole forward: non-reentrant checkpointing stops recomputing once the last saved
tensor is back).
"""

from __future__ import annotations

# The cost model lives in planner/cost/ by concern; this module is its one front door, so
# every consumer reads `costmodel.X` whatever file X is written in.
from planner.cost.assembly import *  # noqa: F401,F403
from planner.cost.chunked import *  # noqa: F401,F403
from planner.cost.gpipeheld import held_per_backward_bytes  # noqa: F401
from planner.cost.layers import *  # noqa: F401,F403
from planner.cost.rules import *  # noqa: F401,F403
from planner.cost.score import *  # noqa: F401,F403
from planner.cost.stepscratch import *  # noqa: F401,F403
from planner.cost.terms import *  # noqa: F401,F403
from planner.cost.useful import least_kept_bytes, unit_layer_bytes, useful_options  # noqa: F401
