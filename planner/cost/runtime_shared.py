"""Facts of torch itself that every runtime built on it shares (planner/cost/runtimes.py's records
read them): the torch version read, its pipelining's buffers, FSDP2's reduce-scatter state beside a
pipeline, the loss under torch.compile, each with the file and version it was read from."""

from __future__ import annotations

from planner.cost.runtime_deepspeed import NOT_READ as DEEPSPEED_STEP_NOT_READ
from planner.cost.runtime_facts import LossRegion

TORCH_V = "torch 2.13.0 (cf30153c)"

PIPELINING_OUTPUTS = "torch/distributed/pipelining/stage.py forward_one_chunk appends the output to output_chunks, schedules.py step() merges them (torch.cat) and returns them; clear_runtime_states empties them as the next step begins"

# the te_moe_experts_kept source of a record whose MoE layers keep what eager PyTorch keeps
EAGER_MOE_KEPT = ("the analytic profile's eager mixture as transformers / torchtitan run it (planner/profiler/"
                  "analytic_kept.py moe_terms: gathered rows, SwiGLU's tensors, the weighted outputs)")

# the wgrad_in_gemm source of a record whose linears run eager autograd (no fused weight-gradient accumulation)
EAGER_WGRAD = ("False: autograd makes each weight's gradient a tensor of its own and AccumulateGrad adds it into "
               "`.grad` (or takes it) once the node returns (torch 2.13 accumulate_grad.h, §690): the profile's "
               "transient holds it (§699)")

NO_CHUNKED_LOSS = "no loss over chunks of the sequence in this runtime's code: --chunked-cross-entropy refused"

MEMTRACKER = "measured: torch MemTracker on CPU, torch 2.13 (scripts/bench_loss_region.py)"

TORCH_PIPELINING = dict(
    stage_input_in_receive_buffer=True, input_receive_buffers="per-microbatch",
    output_grad_buffers_per_microbatch=True, frees_sent_output=False, batch_held="whole-batch",
    sends_held_to_step_end=True, warmup_send_held=True, loss_values_held=True,
)

TORCH_PIPELINING_SOURCES = {
    "stage_input_in_receive_buffer": f"torch/distributed/pipelining/stage.py 902-916, {TORCH_V}; measured on ckplan's runtime",
    "input_receive_buffers": f"torch/distributed/pipelining/stage.py 1285-1291, 1428, {TORCH_V}",
    "output_grad_buffers_per_microbatch": f"torch/distributed/pipelining/stage.py 1285-1291, {TORCH_V}",
    "frees_sent_output": f"torch/distributed/pipelining/stage.py 902-916, 966 (fwd_cache to the backward), {TORCH_V}",
    "batch_held": f"torch/distributed/pipelining/schedules.py 489-499 (the whole batch split), {TORCH_V}",
    "batch_positions": "the model file's batch (inputs, targets) as ckplan's runtime loads it (planner/runtime/worker.py replica_batch): no positions",
    "logits_held_in_backward": f"torch/distributed/pipelining/stage.py 961-991 (backward_one_chunk pops the stage output "
                               f"from fwd_cache and holds it to the end of the last stage's backward), {TORCH_V}",
    "sends_held_to_step_end": "measured on ckplan's runtime (torch's _PipelineScheduleRuntime waits for sends at the step end); "
                              f"ScheduleGPipe's backward sends: torch/distributed/pipelining/schedules.py 930-955 "
                              f"(bwd_sends_to_wait, waited after the last backward), {TORCH_V}; measured, docs/published-runs.md §66.gpipehead",
    "warmup_send_held": f"torch/distributed/pipelining/schedules.py 1062-1087, 1147 (Schedule1F1B's send_work: the warm-up's "
                        f"last fired forward send, replaced only after the steady phase), {TORCH_V}; the send's Work keeps "
                        "its tensor (ProcessGroupGloo.hpp 207-224 SendWork::tensor_; ProcessGroupNCCL.hpp 481-483 "
                        "WorkNCCL::outputs_, a point-to-point's tensor, as pointToPoint sets it at pytorch 0007e752); "
                        "measured on ckplan's runtime (framework-facts §666-§667)",
    "loss_values_held": f"torch/distributed/pipelining/schedules.py 299-304, 318-339 (_internal_losses to the step's end); "
                        f"torch/autograd/__init__.py 225-234 (the backward's ones_like seed), {TORCH_V}; measured on "
                        "ckplan's runtime (framework-facts §649, §669)",
    "outputs_held_to_step_end": f"planner/runtime/worker.py 203 (schedule.step(..., return_outputs=False)); torch/distributed/pipelining/stage.py 906-908 (appended only where save_forward_output), {TORCH_V}",
}

# The after-step facts (afterstep.py) where they were not read: nothing charged past the step.
AFTER_STEP_NOT_READ = {
    "keeps_last_input_and_grad": "not read for this runtime (nothing charged after the step)",
    "te_cublas_workspace": "the runtime's layers are not Transformer Engine's",
    "local_spec_buffer": "no Megatron-core local spec in this runtime (--transformer-impl local refused)",
    "output_layer_buffer": "not read for this runtime (no Megatron-core global memory buffer charged on its last "
                           "stage)",
    "te_ub_workspaces": "the runtime runs no Transformer Engine userbuffers (tp_overlap)",
    "te_ub_keeps_plain_workspace": "the runtime runs no Transformer Engine userbuffers (tp_overlap)",
    "te_grouped_gemm_workspaces": "the runtime's experts do not run Transformer Engine's grouped GEMM (refused)",
    "te_window_offload": "the runtime's activation offload is ckplan's per-layer option (no Transformer Engine "
                         "offload handler)",
    "te_window_handler": "not read for this runtime (no Transformer Engine offload handler: te_window_offload "
                         "False)",
    "te_router_scores": "not read for this runtime (no Transformer Engine router: te_moe_experts_kept False)",
    "offload_refuses_pipeline": "not read as refused for this runtime: ckplan's per-layer offload option is charged "
                                "beside a pipeline as before",
    "fused_ce_bytes": "not read for this runtime: no fused cross-entropy of its own (refused)",
    "fused_cross_entropy": "not read for this runtime: no fused cross-entropy of its own (refused)",
    "side_communicators": "not read for this runtime: only its PP, DP, EP and TP groups' communicators are counted",
    "te_ce_bytes": "not read for this runtime: no Transformer Engine cross-entropy (--te-cross-entropy refused)",
    "step_whole_bytes": "not read for this runtime (nothing charged beside the optimizer's step)",
    "step_shard_bytes": "not read for this runtime (nothing charged beside the optimizer's step)",
    # and Megatron-LM's test settings (jobsettings.py), refused where not read
    "main_grad_hook": "not read for this runtime (its weight-gradient accumulation has no fused path to turn "
                           "off: --no-gradient-accumulation-fusion refused)",
    "logged_read_shard_bytes": "not read for this runtime (--log-params-norm, --log-num-zeros-in-grad refused)",
    "fills_te_outputs": "not read for this runtime (--deterministic-mode refused)",
    "vocab_parallel_ce_bytes": "not read for this runtime: its loss is the profile's (the model's own or the eager "
                               "cross-entropy the analytic profile times)",
    "ce_fill_bytes": "not read for this runtime (no loss of its own charged: vocab_parallel_ce_bytes)",
    "deterministic_attention": "not read for this runtime (--deterministic-mode refused)",
    "host_block_linears": "not read for this runtime (no host floor charged)",
    "host_rest_linears": "not read for this runtime (no host time charged outside the blocks)",
    "step_collectives": "not read for this runtime (its step's scalar all-reduces not charged)",
    "timer_syncs": "not read for this runtime: no timing level (--timing-log-level above 0 refused)",
    **DEEPSPEED_STEP_NOT_READ,
    "zero1_all_reduces": "not read for this runtime: ZeRO 1 reduce-scatters (the gradients' shard reduced where stepped)",
    "nccl_version": "not read for this runtime: NCCL v2.27.7-1's tuning tables, the newest read (nccltuner.py)",
    "hp_grad_accumulate_bytes": "not read for this runtime: its backward accumulates into the gradient it reduces",
    "hp_grad_bytes": "not read for this runtime: the gradient it accumulates and reduces is the only one (grad_bytes)",
    "hp_grad_cast_bytes": "not read for this runtime: nothing cast after each backward (hp_grad_accumulate_bytes 0)",
    "reduce_cast_bytes": "not read for this runtime: its reduction's buffers are not charged beside the step",
    "bf16_zero": "any ZeRO stage the setup gives, as the runtime's data-parallel settings name it",
    "accumulates_without_pipeline": "microbatches on one stage accumulated, as the runtime's own loop runs them "
                                    "(ckplan's runtime: its schedule over one stage; DeepSpeed: "
                                    "gradient_accumulation_steps; ColossalAI: the booster's accumulation)",
    "accumulated_batch": "the whole batch as batch_held says: the runtime's train loop over accumulated microbatches "
                         "not read apart from its schedule",
    "ties_across_stages": "a tied parameter's copies on two pipeline stages, their gradients all-reduced before the "
                          "step: ckplan's runtime planner/runtime/tie.py 32-61; Megatron-LM d98e8a64 "
                          "finalize_model_grads.py 164-259, 671-676 (docs/framework-facts.md §247); DeepSpeed "
                          "pipe/engine.py 275-291, pipe/module.py 470-498 (§248); ColossalAI 4f9953be "
                          "shardformer/policies/llama.py 452-467, booster/plugin/hybrid_parallel_plugin.py 131-136, "
                          "1423 (§305)",
    "pipeline_max_zero": "any ZeRO stage beside a pipeline, as the runtime's data-parallel settings name it",
    "shard_group_zero": "a shard group at any ZeRO stage, as the runtime's data-parallel settings name it",
    "loss_requests_eager_ce": "not read for this runtime: where a replay runs, the loss's scratch is played as its "
                              "largest tensor repeated",
    "final_norm_eager_fp32": "not read for this runtime: the analytic head's fused norm (its bf16 input and 1/rms)",
    "head_reduce_scatter_cat": "not read for this runtime: the analytic head's input gradient and its shard",
}

# The layers' kernels where the runtime runs the model code's own ops: the profile's passes as they are
MODEL_CODE_KERNELS = {"fused_kernels": "the model code's own ops (eager, or inductor's under --compile): the "
                                        "profile's passes as made"}

# torchtitan's loss under torch.compile, read from the code inductor generates for it (scripts/
# compiled_loss.py; planner/profiler/inductor_buffers.py replays each wrapper's empty_strided
# allocations and dels; torch 2.13.0, CPU, 2,048 tokens x 4,096 vocab): AOTAutograd's partition
# saves the bf16 logits themselves, the per-token max and log-sum-exp (fp32) and a scalar; the fp32
# upcast and the log-softmax are fused into the reductions and never materialised. The backward
# allocates one bf16 gradient of the logits. Kept 1.0010, peak 2.0015 x the bf16 logits (8 B per
# token beyond the logits: under 1e-4 of them at a 32k+ vocabulary). What is saved is decided
# before code generation (torch/_functorch/partitioners.py), so it holds on CUDA; what is device
# dependent is the reductions' code: Triton splits a reduction only over fewer rows than SMs x 64
# (torch/_inductor/ir.py 1387-1497 Reduction.num_splits; the CPU backend reduces to one element and
# never splits), into fp32 partials of rows x splits: per-token sized, not logits-sized. No GPU or
# Triton was at hand to generate the CUDA code itself. MemTracker (the 2.00 / 5.97 measured before)
# does not see the compiled region's buffers. Only the whole-vocabulary loss is compiled; under TP
# the vocab-parallel one applies.
COMPILED_LOSS = LossRegion(kept_x=1.0, peak_x=2.0)

# FSDP2's reduce-scatter state beside torch's pipelining (RuntimeFacts.keeps_last_reduce_scatter_input)
RS_INPUT_KEPT = ("torch 2.6.0 (git 2236df17, the release of torch 1963fc8's month): pipelining/stage.py 636-652 "
                  "run_post_backward calls each FSDP2 group's post_backward but not the root's "
                  "_root_post_backward_final_callback, so fsdp/_fully_shard/_fsdp_param_group.py 408-437 leaves the "
                  "last group's reduce_scatter_input in comm_ctx.reduce_scatter_state until the next step's last "
                  "backward (_fsdp_state.py 302-308 drops it only in that callback); pytorch#144535 (2025-01-10) added "
                  "the call")

# FSDP2's reductions beside torch's pipelining (RuntimeFacts.reduces_after_last_backward)
REDUCES_AFTER_LAST_BACKWARD = (
    "torch 2.6.0 (git 2236df17, the release of torch 1963fc8's month): pipelining/stage.py 577-652 "
    "(backward_maybe_with_nosync: every backward with set_requires_gradient_sync(False); at the last one, after "
    "the backward, run_post_backward calls each group's post_backward in turn), fsdp/_fully_shard/"
    "_fsdp_param_group.py 374-437 (post_backward_reduce: the current stream waits for the previous group's "
    "reduce_scatter_state event, then foreach_reduce copies the gradients in on it and reduce-scatters on "
    "FSDP2's stream; _fsdp_collectives.py 375-396), stage.py 726-816 (backward_one_chunk runs it before it stores the input gradients to send), schedules.py 726-736 and "
    "769-783 (Schedule1F1B: get_bwd_send_ops / _batch_p2p after backward_one_chunk), 1256-1266 and 1353-1355 "
    "(PipelineScheduleMulti: the send after the stage's M-th backward); the send's NCCL stream waits for the "
    "current stream (ProcessGroupNCCL's syncStream)")

# torch 2.6.0's PipelineScheduleMulti (RuntimeFacts.multi_schedule_lockstep)
MULTI_LOCKSTEP = (
    "torch 2.6.0 (git 2236df17): pipelining/schedules.py 1236-1355 (PipelineScheduleMulti._step_microbatches: "
    "for each time step of pipeline_order, the rank's action, then its sends and the receives its neighbours' "
    "actions of that step imply, one _batch_p2p(ops).wait()), 1690, 1889, 2003, 2188 (LoopedBFS, Interleaved1F1B, "
    "InterleavedZeroBubble, ZBVZeroBubble subclass it); torch 2.13's interleaved schedules subclass "
    "_PipelineScheduleRuntime instead (schedules.py 2891)")

RS_INPUT_DROPPED = ("torch since pytorch#144535 (2025-01-10) calls the root's _root_post_backward_final_callback after "
                     f"the pipeline's manual post-backward, which drops the reduce-scatter state (pipelining/stage.py "
                     f"1188-1191, {TORCH_V})")

# Each microbatch's input gradient beside torch's pipelining (RuntimeFacts.input_grads_held_to_step_end)
INPUT_GRADS_KEPT = ("torch 2.6.0 (git 2236df17, the release of torch 1963fc8's month): pipelining/_backward.py "
                    "350-361 (stage_backward: torch.autograd.backward accumulates into each input's .grad, and "
                    "grad_inputs reads val.grad without clearing it), stage.py 360-374 and 553 (the input is the "
                    "microbatch's own receive buffer, a leaf), 507-525 (clear_runtime_states sets each buffer's "
                    ".grad = None as the next step begins): every microbatch's input gradient stays from its "
                    "backward to the next step; pytorch#164329 (opened 2025-10-01) drops it once read")
INPUT_GRADS_CLEARED = (f"torch/distributed/pipelining/_backward.py 439-450 (stage_backward sets val.grad = None once "
                       f"read, pytorch#164329: the send holds the one in flight), {TORCH_V}")

TORCHAO_V = "torchao v0.11.0 (f34b473e)"

NO_FSDP2_PIPELINE = "no FSDP2 beside a torch pipelining stage: its own data parallelism reduces its gradients"
