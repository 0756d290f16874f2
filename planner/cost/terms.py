"""The description: each quantity declares how it combines, each term is one row of TERMS, and
layer_value / edge_value / stage_value read the rows by quantity for every consumer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from planner.cost import (
    attention_dropout,
    bridgeterms,
    comm,
    compiled_block,
    contextparallel,
    dataparallel,
    deepspeed_ckpt,
    deepspeed_step,
    deepspeed_terms,
    eager_norm,
    freshgrads,
    frozen,
    fsdp2work,
    gradtiming,
    head_scatter,
    hosttime,
    hpgrads,
    jobsettings,
    lossvalues,
    megatron_dp,
    megatron_loss,
    nccl_sms,
    realtime_tests,
    stepcomm,
    stepcounts,
    te_delayed,
    tiedadd,
    warmupsend,
    wgroups,
)
from planner.cost import quantities as declarations
from planner.cost.gathered import (
    fsdp_unit_layer_bytes,
    fsdp_unit_loss_bytes,
    kept_reduce_scatter_input_bytes,
    unsharded_bytes,
)
from planner.cost.layers import BUFFER_ROWS, LayerCost
from planner.cost.opsacep import op_sac_ep_kept_bytes

# re-exported: costmodel's star import and assembly read the declarations here
from planner.cost.quantities import (  # noqa: F401
    COMBINE,
    QUANTITIES,
    QUANTITY_DECLARATIONS,
    Quantity,
    declared,
    quantities,
)
from planner.cost.repeatedkv import repeated_kv_extra_bytes, repeated_kv_kept_bytes
from planner.cost.rotarytable import rotary_table_bytes
from planner.cost.rules import (
    all_to_all_ms,
    batch_bytes,
    compute_ms,
    expert_parallel_transient_back,
    first_layer_buffer_bytes,
    first_layer_comm_ms,
    first_layer_kept_bytes,
    first_layer_reduced_back_bytes,
    held_outputs_bytes,
    kept_bytes,
    last_layer_buffer_bytes,
    last_layer_comm_ms,
    last_layer_kept_bytes,
    layer_extra_bytes,
    layer_step_ms,
    layer_time_ms,
    loss_kept_bytes,
    passed_grad_bytes,
    per_param_bytes,
    reduced_bytes,
    stage_constant_comm_ms,
    stage_constant_ms,
    stage_constant_transient_bytes,
    static_bytes,
    step_checks_ms,
    tied_once_bytes,
)
from planner.cost.stepscratch import layer_step_scratch_bytes
from planner.cost.tpgathered import tp_gathered_extra_bytes, tp_gathered_kept_bytes
from planner.schema import Profile, TrainSetup

# ---------------------------------------------------------------- the description
# Every term the cost model charges a stage, one row each. The solvers and evaluate() read
# the rows only through layer_value / edge_value / stage_value (summed by quantity), so a
# new term of a known quantity is one row here and its test; each quantity enters a
# stage's cost one way (stage_cost, dpsolve's segments, milp's rows):
#   static, buffers  bytes held all iteration                      added up
#   kept             bytes per microbatch until its backward        x in-flight microbatches
#   extra            a layer's peak beyond what it keeps            max over layers, net of what the
#                                                                   later ones keep; at least the stage's
#   scratch          the optimizer step's temporaries               cuda: added up; cpu: 2 x largest
#   host             host bytes of the rank                         added up, against its node's share
#   offloaded        host bytes per microbatch until its backward   x in-flight microbatches, into host
#   time, comm       ms per microbatch (compute; sends, actions)   added up (busy = time + comm)
#   step             ms once per iteration                          added up
# `where` says whose numbers a row reads: each layer of the stage (with its checkpoint choice), the layer that opens
# or closes the stage (with the stage's index), or the stage's position alone.

@dataclass(frozen=True)
class Context:
    """What a term may read besides its layer and stage."""

    profile: Profile
    setup: TrainSetup  # a stage's terms read the pipeline's stages (placement.stages_view)

    @property
    def device_type(self) -> str:
        return self.profile.device.type


@dataclass(frozen=True)
class Term:
    name: str
    quantity: str  # one of QUANTITIES
    where: str  # "layer": value(layer, option, ctx); "open"/"close": value(layer, stage, ctx);
    #             "stage": value(stage, ctx)
    value: Callable
    source: str  # the measurement or publication that put it here


TERMS: tuple[Term, ...] = (
    # -- every layer of the stage
    Term("weights, gradients, optimizer state", "static", "layer",
         lambda layer, ckpt, ctx: static_bytes(layer, ctx.setup) + stepcounts.layer_bytes(layer, ctx.profile, ctx.setup)
         - bridgeterms.fp8_param_saving_bytes(layer.float8_param_count, ctx.setup, ctx.profile)
         - frozen.frozen_saving_bytes(layer.frozen_param_count, ctx.setup),
         "frozen parameters (requires_grad False) at their weights alone (frozen.frozen_saving_bytes, §710); "
         "bytes per parameter by precision and optimizer, ZeRO and offload (dataparallel.bytes_per_param), the "
         "optimizer's own whole fp32 gradients where the record keeps them (hp_grad_bytes: DeepSpeed 56c52238's "
         "BF16_Optimizer); FP8 primary weights (Megatron-LM's --fp8-param-gather) at the record's fp8_param_bytes (+ a transpose on Hopper: bridgeterms.fp8_param_saving_bytes); Adam's step counts on a CPU device (stepcounts.py, §382)"),
    Term("HSDP ZeRO 3's reduced gradient shards", "buffers", "layer",
         lambda layer, ckpt, ctx: reduced_bytes(layer, ctx.setup),
         "FSDP2 keeps each layer's reduce-scatter output until the backward ends (bench_dp_static.py)"),
    Term("activations kept for backward", "kept", "layer", lambda layer, ckpt, ctx: kept_bytes(layer, ckpt),
         "saved-tensor hooks per layer and recompute option (profiler); a checkpointed layer keeps its input"),
    Term("what a split backward's input pass leaves for its weight pass", "wgrad", "layer",
         lambda layer, ckpt, ctx: layer.options[int(ckpt)].split_held_bytes,
         "live bytes after torch's stage_backward_input beyond the kept ones, per option (profiler)"),
    Term("the input gradient a split backward's input pass hands the layer before, held for its weight pass",
         "wgrad", "layer", lambda layer, ckpt, ctx: passed_grad_bytes(layer),
         "torch's stage_backward_input keeps the gradient passed between two layers of a stage until "
         "stage_backward_weight (measured, torch 2.13: its pass over 1-3 blocks, tests/test_chunked_schedules.py)"),
    Term("a split backward's input pass over what is live before it", "ipeak", "layer",
         lambda layer, ckpt, ctx: layer.options[int(ckpt)].split_input_peak_bytes,
         "peak of torch's stage_backward_input, per option (profiler)"),
    Term("a split backward's weight pass over what is live before it", "wpeak", "layer",
         lambda layer, ckpt, ctx: layer.options[int(ckpt)].split_peak_bytes,
         "peak of torch's stage_backward_weight, per option (profiler): it recomputes checkpointed regions again"),
    Term("a split backward's weight pass's first parameter group over what is live before it", "wfirst", "layer",
         lambda layer, ckpt, ctx: wgroups.weight_pass_first_peak_bytes(layer, int(ckpt)),
         "peak of torch's stage_backward_weight's first torch.autograd.grad, per option (profiler; the whole "
         "pass's where not recorded)"),
    Term("a split backward's weight gradients of the layer, alive while the stage's next layer's weight pass runs",
         "wcarry", "layer", lambda layer, ckpt, ctx: wgroups.weight_pass_carry_bytes(layer, int(ckpt), ctx.setup),
         "torch's stage_backward_weight keeps a parameter group's autograd.grad result bound until the next "
         "group's returns (torch 2.13 pipelining/_backward.py 322-337; measured on ckplan's own ZBV run, "
         "framework-facts §836-838; planner/cost/wgroups.py)"),
    Term("a split backward's weight-pass reruns of the layer, alive to the end of the stage's weight pass", "wleft",
         "layer", lambda layer, ckpt, ctx: wgroups.weight_pass_left_bytes(layer, int(ckpt)),
         "a checkpointed region's reruns a parameter group's call does not unpack stay until the stage's "
         "stage_backward_weight returns (torch 2.13 utils/checkpoint.py 824-826, 1205; measured on ckplan's own "
         "ZBV run, framework-facts §889-§890; planner/cost/wgroups.py)"),
    Term("scratch, and what the option recomputes at once", "extra", "layer",
         lambda layer, ckpt, ctx: layer_extra_bytes(layer, ckpt) - max(expert_parallel_transient_back(layer, ctx.setup),
                                                                       freshgrads.fused_back(layer, ctx.setup)),
         "allocator peak per layer beyond what it keeps (profiler); a rank's routed experts' weight-gradient "
         "temporaries are as large as the experts it holds (measured on the runtime with --ep); a runtime that "
         "accumulates weight gradients inside the GEMM holds none of them fresh (planner/cost/freshgrads.py)"),
    Term("the optimizer's fp32 cast of the layer's largest gradient after the stage's backward, beyond the layer's "
         "own scratch", "extra", "layer",
         lambda layer, ckpt, ctx: hpgrads.cast_extra_bytes(layer, int(ckpt), ctx.setup),
         "the record's hp_grad_cast_bytes (DeepSpeed 56c52238's BF16_Optimizer.update_hp_grads: lp.grad.to(float32), "
         "one parameter at a time, after each microbatch's backward), net of what the layer keeps: the larger of it "
         "and the layer's scratch (planner/cost/hpgrads.py)"),
    Term("TP + SP inputs the column-parallel linears save whole", "kept", "layer",
         lambda layer, ckpt, ctx: tp_gathered_kept_bytes(layer, ckpt, ctx.profile, ctx.setup),
         "the runtime's record (tp_saves_gathered_input): DTensor's ColwiseParallel saves the all-gathered "
         "input (torch/distributed/tensor/parallel/style.py 95-117, torch 2.13)"),
    Term("TP + SP inputs a recomputed layer gathers whole", "extra", "layer",
         lambda layer, ckpt, ctx: tp_gathered_extra_bytes(layer, ckpt, ctx.profile, ctx.setup),
         "as above, during a fully recomputed layer's rerun forward"),
    Term("the all-to-all outputs op-level SAC saves under expert parallelism", "kept", "layer",
         lambda layer, ckpt, ctx: op_sac_ep_kept_bytes(layer, int(ckpt), ctx.setup),
         "torchtitan b5bcd76c activation_checkpoint.py 60-70 saves all_to_all_single's outputs: a MoE block's "
         "dispatch and combine, 2 x a2a_bytes, where the exchange is that op: a compiled model, or a version before "
         "spmd_types became the default (5ab3a0fd1); else rerun, timed by all_to_all (planner/cost/opsacep.py)"),
    Term("K and V repeated to the query heads, saved by attention", "kept", "layer",
         lambda layer, ckpt, ctx: repeated_kv_kept_bytes(layer, ckpt, ctx.profile, ctx.setup),
         "the runtime's record (cp_repeats_kv): torchtitan's repeat_kv copies K/V to every query head before "
         "SDPA, which saves them (9dec370 model.py 116-126, 201-209); planner/cost/repeatedkv.py"),
    Term("K and V repeated to the query heads, rerun in the backward", "extra", "layer",
         lambda layer, ckpt, ctx: repeated_kv_extra_bytes(layer, ckpt, ctx.profile, ctx.setup),
         "as above, where the option or the compiled partition reruns repeat_kv beside the other rerun activations"),
    Term("context parallelism's K/V buffers while the attention runs", "extra", "layer",
         lambda layer, ckpt, ctx: contextparallel.extra_bytes(layer, ctx.setup, int(ckpt)),
         "the runtime's ring (planner/cost/contextparallel.py): received or gathered K/V, per-step outputs, fp32 "
         "accumulators, beyond the layer's own backward transient; a compiled rerun's gathered K/V beside it (§30)"),
    Term("FSDP2's units gathered, the unsharded gradients and a reduce-scatter input while the layer runs", "extra",
         "layer", lambda layer, ckpt, ctx: fsdp_unit_layer_bytes(layer, ckpt, ctx.profile, ctx.setup, lambda: layer_value("kept", layer, ckpt, ctx)),
         "the runtime record's fsdp_units and fsdp_gathered_from_forward (planner/cost/fsdpunits.py); FSDP2's "
         "backward prefetch and one reduce-scatter input at a time (torch 2.13 _fsdp_param_group.py)"),
    Term("DeepSpeed ZeRO 3's gathered and prefetched submodules and two gradients in the layer's backward", "extra",
         "layer", lambda layer, ckpt, ctx: deepspeed_terms.working_set_bytes(layer, int(ckpt), ctx.profile, ctx.setup),
         "the coordinator's fetch, prefetch and reuse-distance release run over the block's trace at the setup's "
         "stage3 knobs (partitioned_param_coordinator.py edaa7221; planner/cost/deepspeed_terms.py, §105)"),
    Term("FSDP2's gradients of the layer in the weights' dtype, beside a pipeline, until its post-backward", "extra",
         "layer", lambda layer, ckpt, ctx: gradtiming.layer_grad_in_flight_bytes(layer, ctx.setup),
         "the runtime record's grads_allocated_at_first_backward: gradient sync off, FSDP2 adds them into the kept "
         "gradients at the unit's post-backward (torch 2.6.0 _fsdp_param.py 629-648; planner/cost/gradtiming.py)"),
    Term("optimizer step temporaries", "scratch", "layer",
         lambda layer, ckpt, ctx: layer_step_scratch_bytes(layer, ctx.setup, ctx.device_type),
         "Adam's sqrt(v) as a new tensor (torch.optim.Adam; measured on the runtime); the reduction's copy of the "
         "gradients in the communication dtype (the record's reduce_cast_bytes: DeepSpeed 56c52238's allreduce_bucket)"),
    Term("offloaded optimizer state, master and gradient on the host", "host", "layer",
         lambda layer, ckpt, ctx: per_param_bytes(layer, ctx.setup, dataparallel.host_bytes_per_param),
         "the runtime's offload (runtime/offload.py): optimizer state, fp32 master, fp32 gradient"),
    Term("DeepSpeed ZeRO 3's fp16 gradient partitions, pinned on the host under the optimizer's offload", "static",
         "layer", lambda layer, ckpt, ctx: -deepspeed_terms.offloaded_grad_partition_bytes(layer, ctx.setup),
         "stage3.py 532-545 (DeepSpeed v0.6.2): grad_partitions_flat_buffer on the offload device (§124)"),
    Term("DeepSpeed ZeRO 3's fp16 gradient partitions on the host", "host", "layer",
         lambda layer, ckpt, ctx: deepspeed_terms.offloaded_grad_partition_bytes(layer, ctx.setup),
         "stage3.py 532-545 (DeepSpeed v0.6.2), pinned (offload_optimizer.pin_memory) (§124)"),
    Term("activations offloaded to the host", "offloaded", "layer",
         lambda layer, ckpt, ctx: layer.options[int(ckpt)].host_bytes,
         "saved-tensor hooks under recompute.offloaded_activations: the bytes it copies out (profiler); "
         "analytic: a block's saved bytes less its input"),
    *(Term(*row) for row in deepspeed_ckpt.ROWS),  # DeepSpeed's cpu_checkpointing (planner/cost/deepspeed_ckpt.py)
    *(Term(*row) for row in (*eager_norm.ROWS, *head_scatter.ROWS, *compiled_block.ROWS)),  # eager head, compiled block
    Term("forward, backward, recompute", "time", "layer",
         lambda layer, ckpt, ctx: compute_ms(layer_time_ms(layer, ckpt, ctx.setup, ctx.profile), ctx.setup.time),
         "timed per layer (profiler), times the calibrated compute scale"),
    Term("DeepSpeed ZeRO 3's third gather of a block's rerun submodules (released after their recompute)", "time",
         "layer", lambda layer, ckpt, ctx: deepspeed_terms.third_gather_ms(layer, int(ckpt), ctx.profile, ctx.setup),
         "stage3_max_reuse_distance's release (planner/cost/deepspeed_terms.py, §103, §105, §111): the whole block "
         "under full recompute, the linears a selective option reruns, beyond the window"),
    Term("the tokens' all-to-all of a MoE block under expert parallelism", "time", "layer",
         lambda layer, ckpt, ctx: all_to_all_ms(layer, ckpt, ctx.setup),
         "dispatch + combine, forward and backward (Megatron-LM's alltoall token dispatcher, torchtitan's "
         "MoE): routed token copies x hidden x dtype bytes x (E-1)/E over the expert-parallel link"),
    # on the critical path with the layer's compute (quantity time: the DP and the MILP read a layer's time rows)
    Term("the layer's tensor-parallel all-gathers and reduce-scatters (all-reduces without SP)", "time", "layer",
         lambda layer, ckpt, ctx: comm.layer_comm_ms(layer, int(ckpt), ctx.setup),
         "the profile's per-layer collectives (bytes) over the tensor-parallel group's link: ring factor, NCCL's "
         "latency model (tuning.cc); hidden beyond the pass's compute only under AsyncTP / TE comm overlap "
         "(the runtime record's tp_overlap; under TE's, ring exchanges as their chunked GEMMs: ub_ring.py; SMs: ub_sms.py; "
         "a ring exchange's shard copied into its buffer and a bulk scatter's chunk cloned out: ub_sms.buffer_copy_bytes), "
         "AsyncTP's fused copies at the copy engines' peer rate where published "
         "(copy_engines.py); a Float8 layer's all-gathers at 1 B an element where the record's "
         "tp_gathers_float8 (torchao's Float8 TP plan casts before it gathers)"),
    Term("context parallelism's K/V exchange beyond the attention it overlaps", "time", "layer",
         lambda layer, ckpt, ctx: contextparallel.exchange_ms(layer, int(ckpt), ctx.setup),
         "Transformer Engine's p2p ring or all-to-all over the heads (context_parallel.py d0067d0d), torch's "
         "all-gather ring (_attention.py, torch 2.13): bytes over the context-parallel group's link, a ring's steps "
         "hidden behind their attention steps, the all-to-all not, nor any exchange of torchtitan 9dec370's "
         "compiled ring (cp_compiled_waits_at_issue: each waited where issued, torch 2.6.0)"),
    Term("the ring around its attention calls: each step's output merged, dQ/dK/dV accumulated", "time",
         "layer", lambda layer, ckpt, ctx: contextparallel.ring_membound_ms(layer, int(ckpt), ctx.profile, ctx.setup),
         "torch's ring (_attention.py _SDPAMerger, _templated_ring_attention_backward, 2.13.0 cf30153c), fused where "
         "the block is compiled; TE's p2p ring (AttnFuncWithCPAndKVP2P, v2.9 70f53666): K/V sends, output "
         "corrections, dq/dK/dV copied and added step by step in bf16; at the profile's memory-bound rate"),
    Term("gradients added into the fp32 main_grad by their own kernel (an embedding's; weights' unfused)", "time",
         "layer", lambda layer, ckpt, ctx: jobsettings.unfused_accumulation_ms(layer, ctx.profile, ctx.setup)
         + jobsettings.embedding_hook_add_ms(layer, ctx.profile, ctx.setup),
         "the hook's add (DDP) or copy (Megatron-FSDP) beyond the .grad add the profile timed, at its elementwise rate: "
         "a weight's under --no-gradient-accumulation-fusion, a lookup table's always (§372-§374, §411-§412)"),
    Term("the optimizer's fp32 gradients added into after every microbatch's backward", "time", "layer",
         lambda layer, ckpt, ctx: hpgrads.hp_grad_accumulate_ms(layer, ctx.profile, ctx.setup),
         "the record's hp_grad_accumulate_bytes a parameter a microbatch (DeepSpeed 56c52238's BF16_Optimizer."
         "update_hp_grads: the bf16 gradient cast to fp32, then added), less the profile's in-place .grad add that its "
         "clear_lp_grads leaves unrun, at the profile's measured elementwise rate"),
    Term("Transformer Engine's outputs filled with NaN first under deterministic mode", "time", "layer",
         lambda layer, ckpt, ctx: jobsettings.deterministic_fill_ms(layer, ckpt, ctx.profile, ctx.setup),
         "the record's fills_te_outputs: torch.use_deterministic_algorithms' fill_uninitialized_memory writes each "
         "aten::empty, and TE allocates its GEMM, norm and attention outputs so (gemm.cpp, quantizer.cpp, "
         "normalization.cpp, attention.cpp, TE v2.16.0): a dense block's bf16 forward outputs and input gradients "
         "(and unfused bf16 weight gradients), and on sm90 cuDNN's deterministic backward's dP workspace (b x h x "
         "s x s x 2 B, cudnn-frontend v1.22.0), at the profile's HBM bandwidth"),
    Term("the host's issue time beyond a block's, the embedding's, the head's and loss's passes (host-bound)", "time",
         "layer", lambda layer, ckpt, ctx: hosttime.host_bound_ms(layer, ckpt, ctx.profile, ctx.setup),
         "max(device, host) per pass: the record's host_block_linears (Megatron-core's TE spec and MoE blocks, "
         "scripts/bench_host.py) and host_rest_linears (bench_host_step.py; the collectives' issue, "
         "--overlap-param-gather's pre-hooks and get_batch: bench_host_comm.py, hostcalls.py) at the host's "
         "CPU time per Linear forward (GPU.host_call_us: TransformerEngine#2053; DGX A100's carried by SPECint)"),
    Term("Megatron-LM's --test-mode checks in each attention forward (q/k norms gathered, asserted on the host)",
         "time", "layer", lambda layer, ckpt, ctx: realtime_tests.realtime_tests_ms(layer, ckpt, ctx.profile, ctx.setup),
         "attention.py run_realtime_tests, Megatron-LM d98e8a64: the host's issue (scripts/bench_host_testmode.py, "
         "GPU.host_call_us) and two all-gathers' NCCL Ring latency (tuning.cc v2.27.7-1)"),
    Term("Transformer Engine's attention under deterministic mode beyond the kernels the profile times", "time",
         "layer", lambda layer, ckpt, ctx: jobsettings.deterministic_attention_ms(layer, ckpt, ctx.profile, ctx.setup),
         "the record's deterministic_attention: cuDNN's deterministic backward on sm90 and on sm100+ without dropout "
         "(fused_attn_f16_arbitrary_seqlen.cu 824-826, TE v2.16.0) at the GPU's published deterministic rate "
         "(GPU.te_attention_deterministic_bwd: NVIDIA/cudnn-frontend's training SDPA benchmark); FlashAttention-2 "
         "below sm90 and on sm100+ under attention dropout (fused_attn.cpp 461-470, TE v2.18.0): its forward at the "
         "GPU's FlashAttention-2 figures and its deterministic backward's split grid in waves of one block an SM "
         "(flash_bwd_launch_template.h, flash-attention 0251105a)"),
    Term("the attention dropout's mask drawn inside Transformer Engine's attention kernels", "time", "layer",
         lambda layer, ckpt, ctx: attention_dropout.attention_dropout_ms(layer, ckpt, ctx.profile, ctx.setup),
         "a Philox draw per score element in the forward and again in the backward (flash-attention dropout.h; "
         "cuDNN's SDPA from its seed and offset), no bytes: the kernel TE runs x its measured time with dropout "
         "over without, forward + backward, p 0.1, head dim 128 (cuDNN on H200 1.034 and on B300 1.094, "
         "TransformerEngine#3312; FlashAttention-2 on GB200 1.047, TransformerEngine#3313)"),
    Term("optimizer step, gradient reduction, weight gathers, tied sums", "step", "layer",
         lambda layer, ckpt, ctx: layer_step_ms(layer, ctx.setup) + tiedadd.tied_local_add_ms(layer, ctx.profile, ctx.setup),
         "timed step per layer (profiler); ring collectives over the links (dataparallel.step_term_ms; Megatron-LM's "
         "DDP issues its reductions and overlapped gathers where the schedule's simulation places them, "
         "megatron_dp.py); a tied table's add on one stage where no charged accumulation is it (tiedadd.py)"),
    Term("the runtime's gradient checks and parameter copy beside the optimizer step", "step", "layer",
         lambda layer, ckpt, ctx: step_checks_ms(layer, ctx.profile, ctx.setup),
         "the record's step_whole_bytes / step_shard_bytes (Megatron-LM: the NaN check of every bucket and the "
         "gradient buffer's zeroing, the "
         "clipping norm, the fp32 main parameters copied to bf16) at the profile's HBM bandwidth"),
    Term("the host's optimizer step: its per-tensor loops and, on the embedding's stage, its fixed calls", "step",
         "layer", lambda layer, ckpt, ctx: hosttime.host_step_ms(layer, ctx.profile, ctx.setup, ckpt),
         "the record's host_rest_linears \"step\" (Megatron-LM's optimizer step, count_zeros, params norm, "
         "scripts/bench_host_step.py) x the layer's parameter tensors, at GPU.host_call_us; after the first sync whole"),
    Term("the step's scalar all-reduces: the gradients' norm, count_zeros, the parameters' norm", "step", "layer",
         lambda layer, ckpt, ctx: stepcomm.step_collectives_ms(layer, ctx.setup, ctx.profile),
         "the record's step_collectives (Megatron-LM's clip_grads.py, common_utils.py calc_params_l2_norm), each at "
         "NCCL's latency over its group: Ring/Simple where the launch forces it (the functional tests'), else the "
         "tuner's least (nccltuner.py, NCCL v2.27.7-1 tuning.cc; stepcomm.py); once a step on the embedding's stage"),
    Term("the parameters' norm and the gradients' zeros logged each step", "step", "layer",
         lambda layer, ckpt, ctx: jobsettings.logged_reads_ms(layer, ctx.profile, ctx.setup),
         "the record's logged_read_shard_bytes over the rank's shard per read (Megatron-LM's --log-params-norm, "
         "--log-num-zeros-in-grad) at the profile's HBM bandwidth"),
    Term("FSDP2's copies around its all-gathers and reduce-scatters", "step", "layer",
         lambda layer, ckpt, ctx: fsdp2work.fsdp2_copies_ms(
             layer.param_count, ctx.setup, ctx.profile.assumptions.get("gpu_hbm_tbps"),
             expert_count=layer.expert_param_count, fp8_count=layer.float8_param_count),
         "the shard's cast and copy into the all-gather input, the copy-out into the unsharded parameters, the "
         "gradients' copy-in to the reduce dtype (torch 2.13 _fsdp_collectives.py), less the profile's .grad "
         "accumulation FSDP2 does not run, at the profile's HBM bandwidth"),
    Term("FSDP2's first unit gathered before any compute and reduced after it; the next layer's hidden by the "
         "first's alone", "step", "layer",
         lambda layer, ckpt, ctx: fsdp2work.edge_units_exposed_ms(layer, ctx.profile, ctx.setup),
         "the record's fsdp_units; FSDP2's stream order at torch 2.6.0 (_fsdp_state.py _root_pre_forward, "
         "_root_post_backward_final_callback; _fsdp_collectives.py foreach_all_gather, foreach_reduce): beyond "
         "dataparallel.exposed_comm_ms's hiding behind each layer's own compute"),
    *(Term(*row) for row in nccl_sms.ROWS + deepspeed_step.ROWS + te_delayed.ROWS + BUFFER_ROWS),  # NCCL's CTAs (nccl_sms.py), ZeRO 3's step (deepspeed_step.py)
    Term("Megatron-LM's first and last bucket: the model's first layer's gather waited before the first forward and "
         "its reduction after the last backward (one stage a rank)", "step", "layer",
         lambda layer, ckpt, ctx: megatron_dp.edge_exposed_ms(layer, ctx.profile, ctx.setup),
         "the record's ddp_buckets; megatron-core 92c8482e param_and_grad_buffer.py 654-700 (buckets from the last "
         "parameter back), distributed_data_parallel.py 405-468 (the forward pre-hook's wait, the backward hook's "
         "issue): beyond dataparallel.exposed_comm_ms's hiding behind each layer's own compute"),
    # -- the layer that opens the stage
    Term("stage input shared with its receive buffer or batch slice", "kept", "open",
         lambda layer, stage, ctx: first_layer_kept_bytes(layer, ctx.setup),
         "PipelineStage's receive buffers hold the input the first layer saves (measured on the runtime)"),
    Term("receive buffers for the input, and its gradient being sent (and those held to the step's end)", "buffers",
         "open", lambda layer, stage, ctx: first_layer_buffer_bytes(layer, stage, ctx.setup),
         "PipelineStage allocates one receive buffer per microbatch (measured on the runtime); the record's "
         "input_grads_held_to_step_end (torch 2.6.0 _backward.py 350-361: each on its buffer's .grad)"),
    Term("first layer's reduced gradient shard, not yet made", "buffers", "open",
         lambda layer, stage, ctx: first_layer_reduced_back_bytes(layer, ctx.setup),
         "FSDP2 under HSDP ZeRO 3 (bench_dp_static.py)"),
    Term("its input gradient is sent back, not handed on", "wgrad", "open",
         lambda layer, stage, ctx: -passed_grad_bytes(layer),
         "the stage input's gradient is the send's (schedules.ChunkBytes.sent_input_grad)"),
    Term("input gradient sent back", "comm", "open",
         lambda layer, stage, ctx: first_layer_comm_ms(layer, stage, ctx.setup),
         "calibrated send line: latency + bytes / bandwidth (ckplan calibrate)"),
    Term("input gradient sent back over the pipeline's link, uncalibrated", "comm", "open",
         lambda layer, stage, ctx: (comm.stage_send_ms(layer.input_bytes, ctx.setup, stage=stage, to=stage - 1)
                                    if stage > 0 else 0.0),
         "bytes / the link between neighbouring stages (NVLink where both ranks share a node, else the network: "
         "comm.stage_crosses_nodes) + NCCL's latency, where no calibrated send line is set (comm.stage_send_ms)"),
    # -- the layer that closes the stage
    Term("stage output waiting in fwd_cache", "kept", "close",
         lambda layer, stage, ctx: last_layer_kept_bytes(layer, stage, ctx.profile, ctx.setup),
         "PipelineStage keeps each forward's output until its backward (measured on the runtime)"),
    Term("receive buffers for the output's gradient", "buffers", "close",
         lambda layer, stage, ctx: last_layer_buffer_bytes(layer, stage, ctx.setup),
         "PipelineStage allocates one per microbatch (measured on the runtime)"),
    Term("outputs kept to the step's end", "buffers", "close",
         lambda layer, stage, ctx: held_outputs_bytes(layer, stage, ctx.setup),
         "the runtime record's outputs_held_to_step_end (torch's output_chunks before pytorch#153383 or where "
         "step() returns them)"),
    Term("an output a 1F1B warm-up send keeps past its backward", "buffers", "close",
         lambda layer, stage, ctx: warmupsend.held_send_bytes(layer, stage, ctx.setup),
         "the runtime record's warmup_send_held (torch 2.13.0 schedules.py 1062-1147: Schedule1F1B's send_work; "
         "measured on the runtime, framework-facts §666-§667)"),
    Term("output sent forward", "comm", "close",
         lambda layer, stage, ctx: last_layer_comm_ms(layer, stage, ctx.setup),
         "calibrated send line (ckplan calibrate)"),
    Term("output sent forward over the pipeline's link, uncalibrated", "comm", "close",
         lambda layer, stage, ctx: (comm.stage_send_ms(layer.output_bytes, ctx.setup, stage=stage, to=stage + 1)
                                    if stage < ctx.setup.pipeline.stages - 1 else 0.0),
         "bytes / the link between neighbouring stages + NCCL's latency, where no calibrated send line is set"),
    # -- the stage's position
    Term("the device idle at each timed region's start (Megatron-LM's --timing-log-level 2)", "time", "stage", lambda
         stage, ctx: hosttime.timer_sync_ms(stage, ctx.profile, ctx.setup), "timers.py 130-155, 2795ebde (§275)"),
    Term("what the loss keeps", "kept", "stage",
         lambda stage, ctx: loss_kept_bytes(ctx.profile, stage, ctx.setup), "saved-tensor hooks on the loss (profiler)"),
    Term("the loss values kept past their backward, and the backward's seed", "buffers", "stage",
         lambda stage, ctx: lossvalues.held_values_bytes(stage, ctx.setup),
         "the runtime record's loss_values_held (torch 2.13.0 schedules.py 299-339: _internal_losses; "
         "autograd/__init__.py 225-234: ones_like; framework-facts §649, §669)"),
    Term("tied parameters held once where all their holders share the stage", "static", "stage",
         lambda stage, ctx: tied_once_bytes(ctx.profile, stage, ctx.setup) + stepcounts.tied_once_bytes(ctx.profile, stage, ctx.setup),
         "one nn.Parameter in one process (planner/cost/tied.py); a Qwen2.5 config counted its embedding twice"),
    Term("a tied table's later holders' gradient, in autograd's InputBuffer to its first holder's backward", "buffers",
         "stage", lambda stage, ctx: tiedadd.buffered_grad_bytes(ctx.profile, stage, ctx.setup), "§336, §381 (tiedadd.py)"),
    Term("DeepSpeed ZeRO 3's host-held gradient partitions of tied copies, given back to the device", "static",
         "stage", lambda stage, ctx: deepspeed_terms.tied_offloaded_grad_partition_bytes(ctx.profile, ctx.setup),
         "the tied copies' bytes above are the device's per parameter, these partitions among them (§124)"),
    Term("DeepSpeed ZeRO 3's gradient partitions of tied copies, on the host once", "host", "stage",
         lambda stage, ctx: -deepspeed_terms.tied_offloaded_grad_partition_bytes(ctx.profile, ctx.setup),
         "one nn.Parameter, one partition (planner/cost/tied.py; §124)"),
    Term("DeepSpeed ZeRO 3's contiguous gradient bucket", "buffers", "stage",
         lambda stage, ctx: deepspeed_terms.gradient_bucket_bytes(ctx.setup),
         "stage3.py 524-529 (DeepSpeed v0.6.2): reduce_bucket_size elements in the training dtype from init (§124)"),
    Term("the whole batch of inputs or targets", "buffers", "stage",
         lambda stage, ctx: batch_bytes(ctx.profile, stage, ctx.setup),
         "the schedule splits the whole batch it holds (measured on the runtime)"),
    Term("the rotary table the model holds, and context parallelism's copies of it", "buffers", "stage",
         lambda stage, ctx: rotary_table_bytes(ctx.profile, stage, ctx.setup),
         "the runtime record's rotary_table (torchtitan 9dec370's freqs_cis on every model chunk; torch 2.6.0's "
         "context_parallel clone and shards of it: planner/cost/rotarytable.py)"),
    Term("FSDP2's gathered weights and unsharded gradient of the largest layer", "buffers", "stage",
         lambda stage, ctx: unsharded_bytes(ctx.profile, stage, ctx.setup),
         "live tensors at the measured peak under ZeRO 2/3 (dataparallel.unsharded_bytes); under Megatron-LM's ZeRO 3, "
         "Megatron-FSDP's own buffers as megatron-core 92c8482e holds them (planner/cost/megatron_fsdp.py)"),
    Term("FSDP2's last reduce-scatter input, kept to the next step beside a pipeline", "buffers", "stage",
         lambda stage, ctx: kept_reduce_scatter_input_bytes(ctx.profile, stage, ctx.setup),
         "the runtime record's keeps_last_reduce_scatter_input (torch before pytorch#144535: the pipeline's manual "
         "post-backward skipped FSDP2's final callback; torch 2.6.0 pipelining/stage.py 636-652)"),
    Term("FSDP2's units gathered at the loss", "extra", "stage",
         lambda stage, ctx: fsdp_unit_loss_bytes(ctx.profile, stage, ctx.setup),
         "the runtime record's fsdp_units and fsdp_gathered_from_forward (planner/cost/fsdpunits.py)"),
    Term("the loss's scratch", "extra", "stage",
         lambda stage, ctx: stage_constant_transient_bytes(ctx.profile, stage, ctx.setup),
         "allocator peak of the loss beyond what it keeps (profiler)"),
    Term("the loss's forward and backward", "time", "stage",
         lambda stage, ctx: stage_constant_ms(ctx.profile, stage, ctx.setup), "timed (profiler)"),
    Term("the runtime's own vocab-parallel cross-entropy beyond the profile's eager loss", "time", "stage",
         lambda stage, ctx: megatron_loss.vocab_parallel_ce_ms(ctx.profile, stage, ctx.setup),
         "the record's vocab_parallel_ce_bytes, ce_fill_bytes (Megatron-LM 6e091e1b cross_entropy.py: 52 B a bf16 "
         "logit, 6 NaN-filled under deterministic mode), fused_ce_bytes, te_ce_bytes (TE v2.9: 10 B, and its TP "
         "all-gather) at the profile's loss rate; Megatron's own chains at their published rate where the GPU has "
         "one (GPU.megatron_ce_efficiency: Liger-Kernel 2120862b's megatron_cross_entropy rows on H100)"),
    Term("two schedule actions per microbatch", "comm", "stage",
         lambda stage, ctx: stage_constant_comm_ms(stage, ctx.setup.time), "calibrated action cost (ckplan calibrate)"),
)


def _rows(quantity: str, where: str) -> tuple[Term, ...]:
    return _BY_PLACE.get((quantity, where), ())


def index_terms(terms: Sequence[Term]) -> dict[tuple[str, str], tuple[Term, ...]]:
    """The rows by (quantity, where), as layer_value / edge_value / stage_value read them."""
    found: dict[tuple[str, str], tuple[Term, ...]] = {}
    for term in terms:
        if term.quantity not in set(declarations.declared()) or term.where not in ("layer", "open", "close",
                                                                                           "stage"):
            raise ValueError(f"term {term.name!r}: unknown quantity {term.quantity!r} or place {term.where!r}")
        found[term.quantity, term.where] = found.get((term.quantity, term.where), ()) + (term,)
    return found


_BY_PLACE = index_terms(TERMS)


def _rows_at(where: str) -> list[Term]:
    return [term for (_, place), terms in _BY_PLACE.items() if place == where for term in terms]


def layer_value(quantity: str, layer: LayerCost, option: int, ctx: Context) -> float:
    """What one layer of a stage adds to `quantity` under its recompute option (index; a bool:
    full or none)."""
    return sum(term.value(layer, option, ctx) for term in _rows(quantity, "layer"))


def edge_value(quantity: str, where: str, layer: LayerCost, stage: int, ctx: Context) -> float:
    """What `layer` adds to `quantity` by opening (where="open") or closing stage `stage`."""
    return sum(term.value(layer, stage, ctx) for term in _rows(quantity, where))


def stage_value(quantity: str, stage: int, ctx: Context) -> float:
    """What stage `stage` adds to `quantity` for its position alone."""
    return sum(term.value(stage, ctx) for term in _rows(quantity, "stage"))
