"""Megatron-LM's record (planner/cost/runtimes.py holds the others): what its code holds, each fact with
the file and version it was read from (RuntimeFacts.sources)."""

from __future__ import annotations

from dataclasses import replace

from planner.cost import runtime_fp16
from planner.cost.bridgesettings import BRIDGE_SETTINGS_SOURCES
from planner.cost.runtime_deepspeed import NOT_READ as DEEPSPEED_STEP_NOT_READ
from planner.cost.runtime_facts import LossRegion, RuntimeFacts
from planner.cost.runtime_shared import MEMTRACKER, NO_CHUNKED_LOSS, NO_FSDP2_PIPELINE

MEGATRON_V = "Megatron-LM d98e8a64 (2026-08-22)"
TE_V = "TransformerEngine v2.9"
# Transformer Engine's offload handler as planner/cost/te_offload.py charges it (docs/framework-facts.md §107, §112)
TE_OFFLOAD_SOURCE = ("TransformerEngine v2.9 (70f53666) transformer_engine/pytorch/cpu_offload.py 343-350 (window "
                     "map), 356-424 (tensor_push), 451-551 (bulk_offload_group, synchronize_on_group_commit_forward), "
                     "560-657 (bulk_reload_group, on_group_commit_backward)")
# the handler Megatron-LM d98e8a64 calls: its pyproject pins TE 4329ff84 (v2.17.1), whose DefaultOffloadSynchronizer
# is v2.10's (docs/framework-facts.md §425-§430)
TE_V210_OFFLOAD_SOURCE = ("Megatron-LM d98e8a64 pyproject.toml 246 (transformer-engine rev 4329ff84, v2.17.1), "
                          "megatron/core/extensions/transformer_engine.py 3442-3470 (TE >= 2.10: "
                          "retain_pinned_cpu_buffers passed); TransformerEngine v2.10 (769ed778) "
                          "transformer_engine/pytorch/cpu_offload.py 548-593 (the maps: release before layer L - N + i's "
                          "forward, reload before layer L - 1 - N + i's backward), 253-347 (one offload stream both "
                          "ways, the compute waiting on its events), 397-403, 482-489 (reloads held to the next "
                          "layer's bwd_step); the same at 4329ff84 (docs/framework-facts.md §425-§428)")
MEGATRON_FSDP_V = "megatron-core 92c8482e (2025-12-01)"  # Megatron-FSDP as Megatron-Bridge 25.11 pins it (planner/cost/megatron_fsdp.py)
# the host's time for a Megatron-core TE-spec dense block's forward and backward, in torch Linear forwards, by the
# profile's attention kind (flash: TE's fused DotProductAttention; eager: its UnfusedDotProductAttention, the
# --attention-backend unfused and local-spec rows): scripts/bench_host.py (9 repeats x 200 calls, torch 2.13.0 CPU;
# the least of the repeats' medians over the Linear's), docs/framework-facts.md §85, docs/published-runs.md §23.hostcall
# "flash_cp2": the block under context parallelism 2, TE's AttnFuncWithCPAndKVP2P (the slower rank's; the same run's
# block without CP: 36.89, 44.18): scripts/bench_host_cp.py, docs/framework-facts.md §97
# "mla_flash", "mla_eager": a latent-attention dense block (MLASelfAttention, Megatron-LM d98e8a64): scripts/bench_host.py
# --only "MLA,dense block" --fastest (7 repeats x 400 calls, torch 2.13.0 CPU; each repeat's fastest call, the machine
# loaded by other work; the same run's dense blocks: 35.62, 36.51 and 45.09, 41.91), docs/framework-facts.md §882
HOST_BLOCK_LINEARS = (("flash", 36.72, 47.29), ("eager", 49.72, 52.76), ("moe", 77.10, 86.41),
                      ("flash_cp2", 68.85, 74.27), ("mla_flash", 56.72, 55.81), ("mla_eager", 66.60, 66.21))
# the host's time for the step outside the blocks, in torch Linear forwards: per microbatch the embedding's, the
# output layer's and the loss's forward and backward, the DDP hook per tensor (with main_grad.add_, without); per
# step a tensor's share of the optimizer's loops before its inner step and the fixed calls, of the inner step's and
# copy-back loops, of count_zeros' and of the params norm's (loop, fixed):
# scripts/bench_host_step.py (9 repeats x 200 calls, torch 2.13.0 CPU), docs/framework-facts.md §97; and the calls beside
# the layers' ops (planner/cost/hostcalls.py): a collective's issue by kind (per call, torch's fake backend), the
# --overlap-param-gather forward pre-hook (a module, a parameter it holds), get_batch's copy (a key):
# scripts/bench_host_comm.py (15 repeats x 200 calls, torch 2.13.0 CPU), docs/framework-facts.md §106; --test-mode's
# realtime check in each attention forward (the stack, a rank's empty_like, unbind and four asserts): scripts/
# bench_host_testmode.py (9 repeats x 400 calls, torch 2.13.0 CPU), docs/framework-facts.md §881
HOST_REST_LINEARS = (("embedding", 3.81, 5.63), ("output", 2.34, 5.90), ("loss", 12.76, 9.70),
                     ("grad_hook", 0.18, 0.04), ("step", 0.48, 2.16), ("inner_step", 0.41, 0.0),
                     ("zeros", 0.67, 0.08), ("params_norm", 0.03, 2.40),
                     ("all-reduce", 0.40, 0.0), ("all-gather", 0.85, 0.0), ("reduce-scatter", 0.82, 0.0),
                     ("broadcast", 0.40, 0.0), ("pre_hook", 0.22, 0.07), ("get_batch", 0.14, 0.0),
                     ("realtime_tests", 0.13, 1.21))
# the scalar all-reduces of a step (planner/cost/stepcomm.py, docs/framework-facts.md §121), Megatron-LM 93ebf8d7: the
# gradients' norm (clip_grads.py get_grad_norm_fp32 132), count_zeros (clip_grads.py 271), calc_params_l2_norm's
# sharded, expert-sharded and model-parallel sums (megatron/training/utils/common_utils.py 171-213)
STEP_COLLECTIVES = (("gradient norm", "grad_stats", ""), ("count_zeros", "grad_stats", "log_num_zeros_in_grad"),
                    ("params norm, sharded", "dp_cp", "log_params_norm"),
                    ("params norm, sharded (GTP)", "dp_cp", "log_params_norm"),
                    ("params norm, expert sharded", "expert_dp", "log_params_norm"),
                    ("params norm, expert sharded (GTP)", "expert_dp", "log_params_norm"),
                    ("params norm, model parallel", "model_parallel", "log_params_norm"),
                    # --fp8-param-gather (which needs the distributed optimizer or an FSDP: arguments.py 709-711 at
                    # megatron-core 92c8482e): the step's master cast into the FP8 weights all-reduces their packed
                    # amaxes (MAX, one fp32 a weight: a few hundred floats, latency-bound) over the optimizer's
                    # data_parallel_group (distrib_optimizer.py 2430-2432; Megatron-FSDP's param_and_grad_buffer.py
                    # 2573-2576: the dense parameters' dp_cp group), TransformerEngine v2.9 tensor/utils.py 206-210
                    # (delayed), 279 (current scaling) (docs/framework-facts.md §675); before the next forward's
                    # all-gather of those weights, so not hidden
                    ("FP8 weights' amaxes (master cast)", "dp_cp", "fp8_all_gather"))
# the timers that synchronize the device at start and stop (docs/framework-facts.md §275-§277), Megatron-LM 2795ebde:
# schedules.py 268/321, 382/437 (each microbatch's compute, level 2), 487/545 (forward-backward, level 1, stopped after
# finalize_model_grads); training.py 1421-1423 (optimizer, level 1)
TIMER_SYNCS = (("forward-compute", 2, "microbatch"), ("backward-compute", 2, "microbatch"),
               ("forward-backward", 1, "step"), ("optimizer", 1, "step"))
# what runs instead of torch.compile, and where that is read (runtimes._NO_MODEL_COMPILE's entry)
NO_MODEL_COMPILE = ("Transformer Engine's fused layers eager (torch.compile only on the small fused elementwise "
                    "functions of its jit_fuser)",
                    f"megatron/training/arguments.py: no argument torch.compiles the model; megatron/core/jit.py 16-33 "
                    f"(jit_fuser = torch.compile on torch >= 2.2) decorates only fused elementwise functions "
                    f"(megatron/core/activations.py, megatron/core/fusions/fused_bias_*.py), {MEGATRON_V}")

# Megatron-LM's --cross-entropy-loss-fusion (native) and --moe-grouped-gemm on TE's layers, read at the versions the
# functional tests' golden values ran (docs/framework-facts.md §89)
FUSED_LOSS_AND_GROUPED_GEMM_SOURCES = {
    "fused_cross_entropy": "megatron/core/fusions/fused_cross_entropy.py 12-133 (the four steps under jit_fuser, "
                           "megatron/core/jit.py 7-33: torch.compile on torch >= 2.2), tensor_parallel/cross_entropy.py "
                           "16-120 (the ops they call), language_module.py 164-165 (cross_entropy_fusion_impl native), "
                           "Megatron-LM ad2ab2ca (2026-01-15, the golden values of gpt3_mcore_te_tp2_pp2_cross_entropy_"
                           "loss_fusion; the same code at d98e8a64): the fp32 copy of the logits (2x the bf16 logits) "
                           "saved as the softmax; in the backward the compiled calculate_gradients writes the index_put "
                           "of the target's -1 into a new fp32 buffer before the multiply and the cast to bf16 (seen on "
                           "torch 2.13.0's inductor: tests/test_megatron_fused_ce.py), 2 + 2 + 1 = 5x at its peak",
    "fused_ce_bytes": "the compiled steps' kernels as torch 2.13.0's inductor writes them (one kernel each, "
                      "tests/test_megatron_fused_ce.py): the cast and max (read 2, write 4), subtract, exp and sum (4 + "
                      "4), divide (4 + 4), and in the backward the index_put's copy, the multiply and the cast (read 4, "
                      "write 4, read 4, write 4 + 2): 40 B a logit, fused_cross_entropy.py at Megatron-LM ad2ab2ca",
    "nccl_version": "NCCL 2.27.7, Megatron-Bridge 25.11's container (framework-facts §142, §148); the functional "
                    "tests' runs read at the same tables",
    "side_communicators": "megatron-core 92c8482e: each process group its own NCCL communicator, made at its first "
                          "collective (initialize.py 342-355 passes no device_id); the default group's barriers "
                          "(megatron/training/initialize.py 221-229, 399-401), the model-parallel group's norm and "
                          "zeros (megatron/core/optimizer/clip_grads.py 96-132, optimizer.py 161-177), TE's CP ring "
                          "(docs/framework-facts.md §115)",
    "te_ce_bytes": "--cross-entropy-fusion-impl te: te_parallel_cross_entropy(logits, labels, tp_group, False) on the "
                   "bf16 vocab-parallel logits as the output layer made them, contiguous (megatron/core/models/common/"
                   "language_module/language_module.py 128-171, extensions/transformer_engine.py 2093-2106, "
                   "megatron-core 92c8482e; reduce_loss False: a loss a token); TransformerEngine v2.9 (70f53666) "
                   "transformer_engine/pytorch/triton/cross_entropy.py: online_softmax_kernel reads each logit "
                   "(72: 2), cross_entropy_kernel reads it again and stores the gradient in the logit's own dtype "
                   "into its storage (174, 187: 2 + 2), the backward's element_mul_kernel scales it in place "
                   "(262-263: 2 + 2; run because Megatron's grad_output is a tensor a token, not the scalar 1.0 "
                   "torch.equal skips, 352-369), cross_entropy.py 76-80 returns it in the input's bf16 (no "
                   "autograd cast): 10 B a logit; per token a few fp32 scalars more (not charged, under 0.1%)",
    "te_grouped_gemm_workspaces": "megatron/core/transformer/moe/experts.py 299-338, 474-505 (the op fuser's "
                                  "te.pytorch.ops.GroupedLinear, Megatron-LM 6815c0fe, the golden values of "
                                  "gpt3_mcore_te_tp1_pp1_te_4experts_groupedGEMM_op_fuser); TransformerEngine "
                                  "transformer_engine/pytorch/ops/basic/grouped_linear.py 17, 824-1040 "
                                  "(general_grouped_gemm), cpp_extensions/gemm.py 42-60 (get_cublas_workspace(..., "
                                  "grouped_gemm=True): tex.get_num_cublas_streams() workspaces of 32 MiB + 1 KiB on sm90+, "
                                  "lru-cached), common/util/multi_stream.cpp 52-54 (num_compute_streams = 4), TE "
                                  "42b84005 (v2.15.0, pinned at 6815c0fe); the same at 4329ff84 (pinned at d98e8a64); "
                                  "the fused cuDSL grouped MLP (ops/fused/forward_grouped_mlp.py 73-80) needs sm 10",
}


def megatron() -> RuntimeFacts:
    return RuntimeFacts(
        name="megatron", version=MEGATRON_V,
        pipeline_schedules=("1F1B", "interleaved-1F1B"),
        grad_bytes=4, shard_weight_bytes=2, master_bytes=4, zero1_whole_tensors=False, zero_as_fsdp2=False, grads_allocated_at_first_backward=False,
        adam_step_scratch=False,
        loss=LossRegion(kept_x=2.0, peak_x=3.0), loss_vocab_parallel=LossRegion(kept_x=2.0, peak_x=3.0),
        loss_compiled=None, tp_saves_gathered_input=False,
        compiles_model=False, runs_instead=NO_MODEL_COMPILE[0],
        stage_input_in_receive_buffer=False, input_receive_buffers="one", output_grad_buffers_per_microbatch=False,
        frees_sent_output=True, batch_held="in-flight-targets", sends_held_to_step_end=False, logits_held_in_backward="never",
        recompute_whole_forward=True, overlaps_grad_reduce=True, fsdp_units="megatron-fsdp", prefetches_zero3_gathers=True, tp_overlap="tp-comm-overlap",
        cublas_workspace_bytes=8 * 4096 * 1024, keeps_last_input_and_grad=True, te_cublas_workspace=True, local_spec_buffer=True, output_layer_buffer=True,
        step_whole_bytes=4 + 4, step_shard_bytes=4 + 4 + 2, cp_comm="p2p", float8="transformer-engine", float8_memory=False, tp_gathers_float8=True,
        fused_kernels="transformer-engine", main_grad_hook=True, wgrad_in_gemm=True, logged_read_shard_bytes=4, fills_te_outputs=True,
        vocab_parallel_ce_bytes=52, ce_fill_bytes=4 + 2,
        deterministic_attention="transformer-engine", host_block_linears=HOST_BLOCK_LINEARS, host_rest_linears=HOST_REST_LINEARS,
        step_collectives=STEP_COLLECTIVES, timer_syncs=TIMER_SYNCS,
        megatron_step_replayed=True, stage_sends_beside="backward",
        bf16_grad_bytes=2, bf16_grad_step_copy_bytes=4, **runtime_fp16.MEGATRON, fp8_param_bytes=1, fp8_param_transpose_bytes=1,
        te_weight_workspace_bytes=1, te_float8_saved_inputs=True, fused_swiglu_saves_input_only=True, te_moe_experts_kept=True, te_window_offload=True,
        te_window_handler="v2.10", te_router_scores="fp32", offload_refuses_pipeline=True,
        te_cross_entropy=LossRegion(kept_x=1.0, peak_x=1.0, grad_in_logits=True), ddp_buckets=True,
        te_grouped_gemm_workspaces=4, fused_cross_entropy=LossRegion(kept_x=2.0, peak_x=5.0), fused_ce_bytes=40,
        te_ce_bytes=2 + (2 + 2) + (2 + 2), te_ub_workspaces=3, te_ub_keeps_plain_workspace=True, side_communicators=True,
        sources={**DEEPSPEED_STEP_NOT_READ,
            "ddp_buckets": "megatron/core/distributed/distributed_data_parallel.py 54-64, 113-121, 256-266, "
                           "405-530; param_and_grad_buffer.py 226-340, 500-515, 654-700; pipeline_parallel/"
                           "schedules.py 1046-1048, 1161-1180, 1246-1283, 1880-1888, 2257-2289; optimizer/"
                           "__init__.py 516-521, optimizer.py 1243-1246; training/training.py 1112-1113, "
                           "2210-2226, megatron-core 92c8482e (docs/framework-facts.md §50, §51); the same "
                           f"at {MEGATRON_V} (distributed_data_parallel.py 131-137, 161-170; training.py "
                           "2179-2194, 2504-2515)",
            "te_moe_experts_kept": f"megatron/core/transformer/moe/experts.py 840-1046 (TEGroupedMLP.forward: "
                                   f"linear_fc1 saves the permuted tokens, the fused weighted GLU its input, "
                                   f"linear_fc2 its input; moe_act's CheckpointWithoutOutput 1019-1030), "
                                   f"fusions/fused_bias_geglu.py 350-445, token_dispatcher.py 660-900 (no tokens kept "
                                   f"by permute, all-to-all, sort or unpermute), {MEGATRON_V}; TransformerEngine "
                                   f"pytorch/router.py FusedTopkScoreFunction (routing map and fp32 scores saved)",
            "te_window_offload": f"--cpu-offloading-num-layers N: megatron/core/transformer/transformer_block.py "
                                 f"304-325, 714-742 (TE's get_cpu_offload_context, transformer_engine/pytorch/"
                                 f"cpu_offload.py, a group a layer; the handler: te_window_handler), {MEGATRON_V}; "
                                 f"the same at megatron-core 92c8482e (306-327, 749-755; docs/framework-facts.md §107, "
                                 f"§112, §322)",
            "te_window_handler": TE_V210_OFFLOAD_SOURCE,
            "te_router_scores": "TransformerEngine 4329ff84 (v2.17.1, Megatron-LM d98e8a64 pyproject.toml 246) "
                                "transformer_engine/pytorch/csrc/extensions/router.cpp 66 (the fused top-k's "
                                "intermediate_output kFloat), 155-158 (the aux loss's scores and intermediate kFloat); "
                                "fp32 since v2.13 (20c38559; docs/framework-facts.md §543)",
            "offload_refuses_pipeline": f"megatron/core/transformer/transformer_config.py 1891-1894 (cpu_offloading "
                                        f"with pipeline_model_parallel_size > 1 raises), 1884-1889 (N < num_layers), "
                                        f"1896-1899 (no recompute beside it), {MEGATRON_V} (docs/framework-facts.md "
                                        f"§321)",
            **BRIDGE_SETTINGS_SOURCES, **runtime_fp16.MEGATRON_SOURCES,
            "chunked_loss": NO_CHUNKED_LOSS + " (Megatron-LM's own fused cross-entropy is --cross-entropy-loss-fusion)",
            "main_grad_hook": "fused (the default): the wgrad GEMM writes into the fp32 main_grad with "
                                   "accumulate, its epilogue reading and writing 4 B each inside the GEMM (timed by its FLOPs: "
                                   "the TE record's backward has no eager accumulation, te_fused.fused_accumulation; "
                                   "TE transformer_engine/"
                                   "pytorch/module/linear.py 1122-1136 at f8a01cd5, v2.16.0; Megatron's own linears "
                                   "wgrad_gemm_accum_fp32, megatron/core/tensor_parallel/layers.py 596-600); "
                                   "--no-gradient-accumulation-fusion (arguments.py 2591-2595; transformer_engine.py "
                                   "901, 1117 pass it as fuse_wgrad_accumulation): the GEMM writes a bf16 gradient "
                                   "(linear.py 1122-1136; layers.py 643) and the DDP hook on its AccumulateGrad adds it "
                                   "into main_grad and drops it (distributed_data_parallel.py 371-372, 466-470): read "
                                   "2 + 4, write 4 in a kernel of its own: 10 B, of which the eager .grad accumulation "
                                   "the TE record puts back under the setting (3 x 2 B, FusedKernelTime.accumulate_ms) "
                                   "counts 6: +4 B a weight a microbatch, Megatron-LM 6e091e1b",
            "wgrad_in_gemm": "gradient_accumulation_fusion (the default; --no-gradient-accumulation-fusion turns it "
                             "off, freshgrads.py reads the setting): TE's linears pass it as fuse_wgrad_accumulation "
                             "and write the wgrad GEMM's result into main_grad with accumulate, no bf16 gradient of "
                             "their own (TE linear.py 1122-1136, v2.16.0; Megatron-LM transformer_engine.py 901, "
                             "1117), Megatron's own linears through wgrad_gemm_accum_fp32 (megatron/core/"
                             "tensor_parallel/layers.py 596-600, 6e091e1b); VocabParallelEmbedding's lookup is no "
                             "GEMM: its table's gradient is made fresh and the DDP hook adds it (§692, §700)",
            "fills_te_outputs": "--deterministic-mode calls torch.use_deterministic_algorithms(True) (megatron/training/"
                                  "arguments.py 1528-1537, Megatron-LM 6e091e1b), whose fill_uninitialized_memory "
                                  "(default True; torch docs, torch.utils.deterministic) writes NaN into every "
                                  "aten::empty (seen here on torch 2.13.0, git cf30153c); TE allocates its GEMM "
                                  "outputs (transformer_engine/pytorch/csrc/extensions/gemm.cpp 178-180 -> "
                                  "quantizer.cpp 162), its norms' outputs and input gradients (normalization.cpp "
                                  "23-25, 140, 224-225, 377) and attention's output and dQ, dK, dV (attention.cpp "
                                  "156-157, 376-450) through at::empty / torch::empty, TE f8a01cd5, v2.16.0",
            "vocab_parallel_ce_bytes": "without --cross-entropy-loss-fusion, compute_language_model_loss runs "
                                       "tensor_parallel.vocab_parallel_cross_entropy on the logits (megatron/core/models/"
                                       "common/language_module/language_module.py 156-183): forward .float() (read 2, "
                                       "write 4), max (4), -= max (4 + 4), exp in place (4 + 4), sum (4), div_ in place "
                                       "(4 + 4), the softmax saved; backward mul_ in place (4 + 4), the rest per token "
                                       "(megatron/core/tensor_parallel/cross_entropy.py 22-117, 181-214), and autograd's "
                                       "cast of the fp32 gradient to the logits' bf16 (4 + 2): 52 B a logit, Megatron-LM "
                                       "6e091e1b (docs/framework-facts.md §77)",
            "ce_fill_bytes": "the fp32 copy (.float(), cross_entropy.py 28) and the gradient's cast back are _to_copy's "
                             "aten::empty_strided outputs, NaN-filled under --deterministic-mode's "
                             "use_deterministic_algorithms (aten/src/ATen/native/cuda/TensorFactories.cu "
                             "empty_strided_cuda; seen on torch 2.13.0: tests/test_megatron_loss.py): 4 + 2 B a logit",
            "host_block_linears": "the TE layer spec's dense block (gpt_layer_specs.py 140-160; transformer_layer.py "
                                  "_forward_attention, _forward_mlp; attention.py get_query_key_value_tensors; "
                                  "fused_bias_dropout.py, fused_bias_gelu.py under jit.py's torch.compile, Megatron-LM "
                                  "6e091e1b), its forward and its backward timed on the host against one torch Linear "
                                  "forward, each TE module a torch Linear (TransformerEngine#2126): scripts/bench_host.py, "
                                  "docs/framework-facts.md §85; \"moe\": the MoE block with the alltoall dispatcher, "
                                  "fused router and permute and TE's GroupedLinear (moe_layer.py, token_dispatcher.py, "
                                  "experts.py, Megatron-LM 0014f137), scripts/bench_host.py MoEBlock, §94; \"flash_cp2\": the "
                                  "block with TE's AttnFuncWithCPAndKVP2P at CP 2 (context_parallel.py 1407-2990, "
                                  "TE f8a01cd5), scripts/bench_host_cp.py, §97; \"mla_flash\", \"mla_eager\": the TE spec's "
                                  "latent-attention block (gpt_layer_specs.py 244-318, multi_latent_attention.py "
                                  "298-470, 638-1003, rope_utils.py 92-157, Megatron-LM d98e8a64), scripts/bench_host.py "
                                  "MLABlock, §882",
            "timer_syncs": "Megatron-LM 2795ebde megatron/core/timers.py 130-155 (Timer.start and stop each "
                           "torch.cuda.synchronize(); a level above --timing-log-level gives a DummyTimer, 217-241), "
                           "schedules.py 268, 382, 487, training.py 1421 (§275-§277)",
            "step_collectives": "Megatron-LM 93ebf8d7: megatron/core/optimizer/clip_grads.py 55-141 "
                                "(get_grad_norm_fp32: one all-reduce over grad_stats_parallel_group, whole world "
                                "under the distributed optimizer, distrib_optimizer.py 796-802; optimizer.py 322-340 "
                                "the model-parallel group otherwise), 195-276 (count_zeros_fp32, the same group, "
                                "then .item()); megatron/training/utils/common_utils.py 80-213 (calc_params_l2_norm: "
                                "two sums over the data-parallel group with CP, two over the expert-data-parallel "
                                "group, whatever they hold, one over the model-parallel group, then .item())",
            "host_rest_linears": "the step outside the blocks, Megatron-LM d98e8a64: language_model_embedding.py "
                                 "forward; gpt_model.py _postprocess; language_module.py compute_language_model_loss, "
                                 "tensor_parallel/cross_entropy.py; pretrain_gpt.py loss_func 254-277 (validate_result's "
                                 "NaN/Inf reads); distributed_data_parallel.py 560-584 (the backward post-hook); "
                                 "optimizer/optimizer.py 216-292, 816-845, distrib_optimizer.py 2756-2850, "
                                 "clip_grads.py 55-258 (TE's multi_tensor_scale_tensor: no .item() in the norm), "
                                 "training/utils/common_utils.py 52-208 (calc_params_l2_norm), training.py 3312 "
                                 "(training_log's loss .item()): scripts/bench_host_step.py, docs/framework-facts.md §97; "
                                 "the collectives' issue (torch.distributed's wrapper and c10d's dispatch, torch 2.13.0's "
                                 "fake backend), distributed_data_parallel.py 485-536 and param_and_grad_buffer.py 538-560 "
                                 "(the forward pre-hook), pretrain_gpt.py 110-150 and core/utils.py 2167-2320 "
                                 "(get_batch): scripts/bench_host_comm.py, docs/framework-facts.md §106; \"realtime_tests\": "
                                 "attention.py 1753-1822 run_realtime_tests (--test-mode), Megatron-LM d98e8a64: "
                                 "scripts/bench_host_testmode.py, docs/framework-facts.md §881",
            "deterministic_attention": "--deterministic-mode asks for NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 (megatron/core/"
                                       "extensions/transformer_engine.py 1566-1572, Megatron-LM 6e091e1b; 1697-1702 "
                                       "at 7e6a045a) and passes config.attention_dropout (default 0.1, "
                                       "transformer_config.py 184) to TE's DotProductAttention (1771-1772); TE then "
                                       "keeps FusedAttention's F16_arbitrary_seqlen backend on sm90 and sets cuDNN's "
                                       "set_deterministic_algorithm (fused_attn_f16_arbitrary_seqlen.cu 824-826), drops "
                                       "FusedAttention below sm90 (dot_product_attention/utils.py 1344-1356), TE "
                                       "f8a01cd5, v2.16.0; on sm100+ offers it for deterministic training only "
                                       "without dropout (common/fused_attn/fused_attn.cpp 461-470, TE e7c550c5, "
                                       "v2.18.0, since 27fc168e): FlashAttention-2 runs there (FlashAttention-3 "
                                       "is sm90's, FlashAttention-4 refuses dropout: utils.py 495-498, 1010-1015)",
            "zero1_all_reduces": "the distributed optimizer reduce-scatters its buckets (--use-distributed-optimizer)",
            "hp_grad_accumulate_bytes": "the wgrad GEMM accumulates into main_grad (gradient_accumulation_fusion); "
                                        "main_grad_hook charges the path without it",
            "hp_grad_bytes": "main_grad is the one gradient (grad_bytes 4): no second copy beside it",
            "hp_grad_cast_bytes": "nothing cast after each backward: the wgrad GEMM writes into main_grad",
            "reduce_cast_bytes": "DDP reduces its buckets in place in the grad buffer (ddp_buckets)",
            "bf16_zero": "ZeRO 0 (DDP) or 1 (--use-distributed-optimizer), as the setup gives",
            "accumulates_without_pipeline": "megatron/core/pipeline_parallel/schedules.py "
                                            "forward_backward_no_pipelining: num_microbatches forwards and backwards "
                                            "a step",
            "accumulated_batch": "batch_held's one microbatch a forward (get_batch per microbatch) with or without a "
                                 "pipeline: not read apart",
            "pipeline_max_zero": "not read: the ZeRO stage the setup gives beside a pipeline",
            "ties_across_stages": "megatron/core/distributed/finalize_model_grads.py 164-259, 671-676 (the shared "
                                  "embedding's main_grad all-reduced over the first and last stage), §247",
            "shard_group_zero": "not read: a shard group at the stage the setup gives",
            "loss_requests_eager_ce": "not played: TE's or Megatron's vocab-parallel cross-entropy, no FSDP2 replay "
                                      "(its reserve replays its own records, reserve_megatron.py)",
            "final_norm_eager_fp32": "not read for this runtime (its final norm module, "
                                     "--normalization, framework-facts §179): the analytic head's fused norm",
            "head_reduce_scatter_cat": "not read for this runtime: Megatron-LM's sequence dimension is first "
                                       "([s, b, h]), its reduce-scatter needs no cat: the analytic head's",
            "logged_read_shard_bytes": "--log-params-norm: calc_params_l2_norm every iteration (training.py 3653-3654) "
                                       "over each parameter's main_param, the fp32 shard the distributed optimizer "
                                       "sets (megatron/training/utils/common_utils.py 51-151; distrib_optimizer.py "
                                       "434-435), multi_tensor_l2norm: 4 B; --log-num-zeros-in-grad: count_zeros in "
                                       "every step (optimizer.py 1014) over the shard's fp32 main grads "
                                       "(count_zeros_fp32, clip_grads.py 199-260; distrib_optimizer.py 2697): 4 B, "
                                       "Megatron-LM 6e091e1b",
            "fused_kernels": f"megatron/core/models/gpt/gpt_layer_specs.py (TELayerNormColumnParallelLinear: the norm "
                             f"inside linear_qkv / linear_fc1), megatron/core/fusions/fused_bias_swiglu.py, "
                             f"fused_bias_gelu.py (jit_fuser = torch.compile, megatron/core/jit.py), Megatron-LM "
                             f"6e091e1b; rope_utils.py 21 (TE's fused rotary under apply_rope_fusion), {MEGATRON_V}; "
                             f"TE layernorm_linear.py 208, 955-966, {TE_V} (planner/profiler/te_fused.py)",
            "cp_comm": f"megatron/training/arguments.py 3221 (--cp-comm-type default p2p); megatron/core/extensions/"
                       f"transformer_engine.py 2141-2153 (passed to TE), {MEGATRON_V}; Transformer Engine "
                       "transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py "
                       "AttnFuncWithCPAndKVP2P 1356-2150 (forward), 2340-2420 (backward buffers), d0067d0d (2026-08-22)",
            "cp_repeats_kv": f"megatron/core/extensions/transformer_engine.py 2092 (TEDotProductAttention passes "
                             f"num_gqa_groups: K and V reach TE's attention, and its ring, at their query groups' "
                             f"heads); the repeat_interleave of dot_product_attention.py 169-175 is Megatron's unfused "
                             f"attention only, {MEGATRON_V}",
            "rotary_table": "Megatron-core's RotaryEmbedding (its cached frequencies) not read (nothing charged)",
            "cp_compiled_waits_at_issue": "Transformer Engine's ring runs in its own autograd functions on its own "
                                          "streams (context_parallel.py, d0067d0d), not traced by a compile: its "
                                          "p2p model holds",
            "step_replayed": "ckplan's step replay does not order Megatron-LM's: its own replay does (megatron_step_replayed)",
            "megatron_step_replayed": f"planner/cost/reserve_megatron.py: megatron/core/distributed/param_and_grad_buffer.py "
                                      f"1181-1194, 1304-1310; optimizer/distrib_optimizer.py 445; optimizer/optimizer.py "
                                      f"1012; pipeline_parallel/schedules.py 171-201, 506, 539-599, 814-860, 2277-2475; "
                                      f"p2p_communication.py 335-349; tensor_parallel/cross_entropy.py 25, 62, 77, 181, "
                                      f"{MEGATRON_V}; TransformerEngine transformer_engine/pytorch/optimizers/"
                                      f"fused_adam.py 452-460, 616, 4329ff84 (docs/framework-facts.md §43); the interleaved "
                                      f"schedule schedules.py 929-1016, 1244-1332, 1544-2058 (reserve_megatron_chunks.py, "
                                      f"§52); the layers' own allocations are the profile's records holding what TE's "
                                      f"layers save (te_kept.te_record, §53), not Transformer Engine's kernels' order; "
                                      f"Megatron-FSDP's step with --fsdp-double-buffer: reserve_megatron_fsdp.py (§129)",
            "fsdp2_step_replayed": "Megatron-LM shards with its distributed optimizer or Megatron-FSDP, not FSDP2 "
                                   "(Megatron-FSDP's buffers: fsdp_units)",
            "expandable_segments": "not read from its launch scripts: its replay runs the default segments unless --expandable-segments says otherwise",
            "expandable_segments_across_nodes": "not read from its launch scripts",
            "input_grads_held_to_step_end": f"megatron/core/pipeline_parallel/schedules.py: one input gradient sent at a time (input_receive_buffers \"one\"), {MEGATRON_V}",
            "keeps_last_reduce_scatter_input": f"{NO_FSDP2_PIPELINE} (the distributed optimizer's buckets, {MEGATRON_V})",
            "pipeline_schedules": f"megatron/core/pipeline_parallel/schedules.py 53-167 (get_forward_backward_func: forward_backward_pipelining_without_interleaving, or _with_interleaving where a virtual pipeline size is set), {MEGATRON_V} (docs/framework-facts.md §251)",
            "reduces_after_last_backward": f"{NO_FSDP2_PIPELINE} (the distributed optimizer's buckets, {MEGATRON_V})",
            "multi_schedule_lockstep": f"not torch's pipelining: megatron/core/pipeline_parallel/schedules.py, {MEGATRON_V}",
            "stage_sends_beside": f"megatron/core/pipeline_parallel/schedules.py 1771-1827 (pp_post_forward: the output's isend waited at once, deallocate_pipeline_outputs set by training/argument_utils.py 305), 1847-1897 (pp_post_backward: the input gradient's waited at the next backward's send), {MEGATRON_V} (docs/framework-facts.md §214)",
            "grads_allocated_at_first_backward": f"megatron/core/distributed/param_and_grad_buffer.py 1066, 1168 (one buffer per model chunk, allocated at start, kept for the run), {MEGATRON_V}",
            "grad_bytes": f"megatron/core/distributed/param_and_grad_buffer.py 895, 924 (fp32 main_grad); "
                          f"megatron/training/arguments.py 1204-1217 (bf16 forces fp32 accumulation), {MEGATRON_V}",
            "shard_weight_bytes": f"megatron/core/distributed/param_and_grad_buffer.py (bf16 param buffer), {MEGATRON_V}",
            "master_bytes": f"megatron/core/optimizer/distrib_optimizer.py (fp32 main params), {MEGATRON_V}",
            "zero1_whole_tensors": f"megatron/core/optimizer/distrib_optimizer.py 200-243 (even flat bucket ranges), {MEGATRON_V}",
            "zero_as_fsdp2": "Megatron-LM's DDP and distributed optimizer",
            "fsdp_units": f"ZeRO 3 is Megatron-FSDP (--use-megatron-fsdp, optim_grads_params): every TransformerLayer "
                          f"a unit (megatron/core/distributed/fsdp/mcore_fsdp_adapter.py 95-97), the other modules "
                          f"gathered to the step, double buffers, prefetch and gradient buckets as "
                          f"planner/cost/megatron_fsdp.py reads them from megatron_fsdp/megatron_fsdp.py and "
                          f"param_and_grad_buffer.py at {MEGATRON_FSDP_V} (docs/framework-facts.md §114); ZeRO 2 "
                          f"(optim_grads) keeps the largest-layer term (its gradient buckets not read)",
            "cpu_collectives": "NCCL: the framework trains on GPUs alone",
            "fsdp_gathered_from_forward": "Megatron-FSDP's non-unit modules, gathered from their first forward to the "
                                          "step (planner/cost/megatron_fsdp.py), not FSDP2's units",
            "adam_step_scratch": f"megatron/core/optimizer/__init__.py 14-20 (TE / apex FusedAdam), {MEGATRON_V}",
            "loss": f"megatron/core/tensor_parallel/cross_entropy.py 20-26, 61-79, 139-185 (in-place exp, div; "
                    f"saves the fp32 softmax), {MEGATRON_V}; {MEMTRACKER}: kept 2.00, peak 2.97",
            "loss_vocab_parallel": "as loss (the same function over the vocab shard)",
            "loss_compiled": "Megatron-LM does not torch.compile the loss",
            "compiles_model": NO_MODEL_COMPILE[1],
            "runs_instead": NO_MODEL_COMPILE[1],
            "tp_saves_gathered_input": f"megatron/core/tensor_parallel/layers.py 604, 627-631, 667-682 "
                                       f"(saves the sharded input, re-gathers in backward), {MEGATRON_V}",
            "stage_input_in_receive_buffer": f"megatron/core/pipeline_parallel/schedules.py (fresh input tensors), {MEGATRON_V}",
            "input_receive_buffers": f"megatron/core/pipeline_parallel/schedules.py, {MEGATRON_V}",
            "output_grad_buffers_per_microbatch": f"megatron/core/pipeline_parallel/schedules.py, {MEGATRON_V}",
            "frees_sent_output": f"megatron/core/pipeline_parallel/schedules.py 171-190 (deallocate_output_tensor), {MEGATRON_V}",
            "batch_held": f"megatron/core/pipeline_parallel/schedules.py (a microbatch per forward), {MEGATRON_V}", "batch_positions": "not read: get_batch's position_ids, loss_mask and attention_mask beside tokens and labels are not charged (docs/framework-facts.md §679 read the tokens and labels)",
            "sends_held_to_step_end": f"megatron/core/pipeline_parallel/schedules.py, {MEGATRON_V}",
            "warmup_send_held": f"its own schedules.py (no torch Schedule1F1B: a sent output is freed, frees_sent_output), {MEGATRON_V}",
            "loss_values_held": f"its own schedules.py (each microbatch's reduced loss: not read as this fact, none charged), {MEGATRON_V}",
            "outputs_held_to_step_end": f"megatron/core/pipeline_parallel/schedules.py 328-350 (the last stage keeps "
                                        f"each microbatch's reduced loss, not its output), 171-190 (sent outputs "
                                        f"deallocated), {MEGATRON_V}",
            "logits_held_in_backward": f"megatron/core/models/gpt/gpt_model.py (forward: `loss = self."
                                       f"compute_language_model_loss(labels, logits)`; `return loss`, the logits a local), "
                                       f"tensor_parallel/cross_entropy.py (the loss saves its fp32 copy, not them), {MEGATRON_V}",
            "recompute_whole_forward": f"megatron/core/tensor_parallel/random.py CheckpointFunction, {MEGATRON_V}",
            "overlaps_grad_reduce": f"--overlap-grad-reduce, megatron/core/distributed/distributed_data_parallel.py, "
                                    f"{MEGATRON_V}: the default where a setup does not say (DataParallelSetup."
                                    f"overlap_grad_reduce; Megatron-LM's own default is off, arguments.py 3121)",
            "prefetches_zero3_gathers": f"--overlap-param-gather, {MEGATRON_V}",
            "tp_overlap": f"--tp-comm-overlap (Transformer Engine userbuffers), {MEGATRON_V}",
            "float8": f"--fp8-format hybrid with --fp8-recipe tensorwise|delayed: Transformer Engine's Linear runs the "
                      f"forward, input-grad and weight-grad GEMMs in FP8 (transformer_engine/pytorch/module/"
                      f"linear.py 164-266, 312, 620-640, {TE_V}); megatron/core/extensions/transformer_engine.py, "
                      f"{MEGATRON_V}",
            "float8_memory": "torchao's rule not applied: TE's FP8 weight copies and saved inputs are the record's "
                             "te_weight_workspace_bytes, fp8_param_*, te_float8_saved_inputs (TE v2.9)",
            "async_tp_workspace": "not AsyncTP: Transformer Engine's userbuffers under --tp-comm-overlap are not read here",
            "tp_gathers_float8": f"transformer_engine/pytorch/module/layernorm_linear.py 186-192, 233-265 (the norm "
                                 f"quantizes the T / tp shard row-wise, gathered in FP8), module/base.py 1161-1193 "
                                 f"(a row-parallel Linear's grad_output quantized on the shard and gathered in FP8), "
                                 f"distributed.py 903-984 (`_all_gather_fp8`: the 1 B data alone), {TE_V}; the same "
                                 f"at v2.16 (docs/framework-facts.md §301-§302); Megatron-LM saves the shard "
                                 f"(tp_saves_gathered_input), so only the collectives' bytes read it",
            "float8_saves_input": "not read: Transformer Engine's record saves the quantized input itself "
                                  "(planner/profiler/float8.py te_backward)",
            "cublas_workspace_bytes": "tests/functional_tests/test_cases/gpt/gpt3_7b_tp*_memory_speed/model_config.yaml "
                                      "CUBLAS_WORKSPACE_CONFIG :4096:8 (8 x 4 MiB); torch allocates it through the "
                                      "caching allocator, one per handle and stream, the cuBLASLt one unified with it "
                                      "(aten/src/ATen/cuda/CublasHandlePool.cpp, getCUDABlasLtWorkspaceSize); two "
                                      "of them, the forward's thread's and autograd's (planner/cost/afterstep.py "
                                      "TORCH_BLAS_THREADS)",
            "keeps_last_input_and_grad": "megatron/core/pipeline_parallel/schedules.py 428-429 (forward_step: "
                                         "set_input_tensor(input_tensor)), 478-483 and 505-513 (backward_step: "
                                         "x.retain_grad(), input_tensor_grad = x.grad); megatron/core/transformer/"
                                         "transformer_block.py 440-448, 573 (self.input_tensor kept, the chunk's "
                                         "hidden states), Megatron-LM 6e091e1b (2026-05-30); the same at "
                                         f"{MEGATRON_V} (schedules.py 507, 561, 591; transformer_block.py 463, 588)",
            "step_whole_bytes": "megatron/core/distributed/param_and_grad_buffer.py 313-349, 599-600 (check_grads: "
                                "each bucket's grad_data.norm before its reduction: 4 B read), on by default: "
                                "megatron/training/training.py 1910, arguments.py 2519-2521 "
                                "(--no-check-for-nan-in-loss-and-grad turns it off); and every train_step first "
                                "zeroes the whole fp32 gradient buffer, 4 B written (training.py 2179-2181 "
                                "model_chunk.zero_grad_buffer(); distributed_data_parallel.py 566-580, "
                                "param_and_grad_buffer.py 1471-1475 grad_data.zero_()), Megatron-LM 6e091e1b",
            "step_shard_bytes": "--clip-grad defaults to 1.0 (arguments.py 2295-2296): the norm of the shard's fp32 "
                                "gradients; distrib_optimizer.py 2707-2795 (_copy_main_params_to_model_params: fp32 "
                                "main shard into the bf16 parameter buffer), Megatron-LM 6e091e1b",
            "local_spec_buffer": "--transformer-impl local builds get_gpt_layer_local_spec (gpt_builders.py 109-147; "
                                 "megatron/core/models/gpt/gpt_layer_specs.py 359-471, LocalSpecProvider in "
                                 "megatron/core/models/backends.py 99-146: ColumnParallelLinear, RowParallelLinear, "
                                 "DotProductAttention, no TE module); DotProductAttention.forward takes baddbmm's input "
                                 "(beta 0) from parallel_state.get_global_memory_buffer().get_tensor((b x np, sq, sk), "
                                 "query.dtype, 'mpu') (megatron/core/transformer/dot_product_attention.py 189-191; "
                                 "context parallelism asserted 1, 57-58); GlobalMemoryBuffer.get_tensor keeps one "
                                 "tensor per (name, dtype), made again only larger, never freed (megatron/core/utils.py "
                                 "727-753); the sequence-parallel linear's all-gathered input takes the same 'mpu' "
                                 "buffer (megatron/core/tensor_parallel/layers.py 623-629, 667-673); the local linear is "
                                 "torch.matmul (layers.py 451-462, 683, 782): no TE GEMM, so no TE workspace; "
                                 f"{MEGATRON_V}",
            "output_layer_buffer": "megatron/core/models/gpt/gpt_model.py 272-293 (the output layer is "
                                   "tensor_parallel.ColumnParallelLinear under every spec; TE's "
                                   "TELMHeadColumnParallelLinear only under MXFP8's output projection); "
                                   "tensor_parallel/layers.py 623-629 (forward) and 667-673 (the weight gradient's "
                                   "gather) under sequence_parallel: get_global_memory_buffer().get_tensor((s x "
                                   "tp, b, h), input.dtype, 'mpu'); utils.py 727-753 (GlobalMemoryBuffer: one tensor "
                                   f"a (name, dtype), never freed), {MEGATRON_V}; the same at 4828d651 (layers.py "
                                   "503, 540; G10's golden memory) and 92c8482e (layers.py 486; Megatron-Bridge "
                                   "25.11) (docs/framework-facts.md §160)",
            **FUSED_LOSS_AND_GROUPED_GEMM_SOURCES,
            "te_ub_workspaces": "transformer_engine/pytorch/cpp_extensions/gemm.py 31 (_NUM_MAX_UB_STREAMS = 3), "
                                "43-52 (get_cublas_workspace(device, ub=True, ...): one torch.empty of 3 x TE's "
                                "workspace, lru-cached apart from the plain one), 133 (general_gemm passes ub is not "
                                "None); module/linear.py 771-797, 1130-1160 (a row-parallel linear's weight-gradient "
                                "GEMM runs with no communicator: the plain workspace is made too), TransformerEngine "
                                "4220403e (the revision Megatron-LM 4828d651, which wrote G10's golden memory, pins) "
                                "and 4329ff84 (pinned at d98e8a64), the same lines; v2.9 made the 3 x workspace in "
                                "initialize_ub in place of the plain one (module/base.py 278-286): one fewer there "
                                "(docs/framework-facts.md §158)",
            "te_ub_keeps_plain_workspace": "TransformerEngine 4220403e / 4329ff84 (the revisions Megatron-LM 4828d651 "
                                           "and d98e8a64 pin): cpp_extensions/gemm.py 43-52 lru-caches "
                                           "get_cublas_workspace per (device, ub), and initialize_ub makes no "
                                           "workspace; module/linear.py 771-797 (a row-parallel linear's weight-"
                                           "gradient GEMM without a communicator takes the plain one): both "
                                           "allocated (docs/framework-facts.md §158, §160)",
            "te_cublas_workspace": "--transformer-impl transformer_engine (the test cases' model_config.yaml); "
                                   "transformer_engine/pytorch/cpp_extensions/gemm.py 34-60 (get_cublas_workspace, "
                                   "lru-cached per device), TransformerEngine f8a01cd5 (2026-05-29), the revision "
                                   "Megatron-LM 6e091e1b's pyproject.toml pins; the same at 4329ff84 (2026-08-04), "
                                   f"pinned at {MEGATRON_V}",
        })


# Megatron-Bridge 25.11's megatron-core (its 3rdparty/Megatron-LM at 00b7660b) with the TE its container holds,
# v2.9: the record above but where that TE's code differs from the newer one's (docs/framework-facts.md §160)
BRIDGE_MCORE = "92c8482e"
TE_V29_UB_WORKSPACE = ("TransformerEngine v2.9 (70f53666) transformer_engine/pytorch/module/base.py 85-92 (get_workspace: "
                       "the one plain workspace), 278-286 (initialize_ub: _cublas_workspace = get_workspace()."
                       "repeat(_NUM_MAX_UB_STREAMS), the plain tensor dropped for it), module/linear.py 312, 715 (every "
                       "GEMM takes get_workspace(): the 3x one); no per-ub lru cache in cpp_extensions/gemm.py there")


def megatron_bridge() -> RuntimeFacts:
    """Megatron-LM's record as Megatron-Bridge 25.11 runs it: megatron-core 92c8482e, TransformerEngine v2.9."""
    record = megatron()
    return replace(record, version=f"megatron-core {BRIDGE_MCORE} (Megatron-Bridge 25.11, TE v2.9)",
                   te_ub_keeps_plain_workspace=False, stage_sends_beside="both", te_window_handler="v2.9",
                   te_router_scores="logits",
                   sources={**record.sources, "te_ub_keeps_plain_workspace": TE_V29_UB_WORKSPACE,
                            "te_router_scores": "TransformerEngine v2.9 (70f53666) transformer_engine/pytorch/csrc/"
                                                "extensions/router.cpp 42-47, 106-112 (the top-k's intermediate, the aux "
                                                "loss's scores and intermediate in logits.scalar_type()), the same to "
                                                "v2.12 (docs/framework-facts.md §543)",
                            "te_window_handler": f"{TE_OFFLOAD_SOURCE}: the Bridge 25.11 pins >=2.9.0a0,<2.10.0 "
                                                 f"(docs/framework-facts.md §107, §112, §377-§379)",
                            "stage_sends_beside": f"megatron/core/pipeline_parallel/schedules.py 1595-1646 (pp_post_forward: the output's isend waited at the next forward's send, whatever deallocate_pipeline_outputs says), 1666-1710 (pp_post_backward: the input gradient's likewise), megatron-core {BRIDGE_MCORE} (docs/framework-facts.md §215)"})
