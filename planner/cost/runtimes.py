"""One record of facts per runtime: what each framework holds, in which dtype, and when it frees,
read from its code at a stated version. The cost terms read these records (planner/cost/rules.py,
dataparallel.py, chunked.py); no term tests a runtime's name.

Each field of RuntimeFacts is one fact; each record carries, per field, the file and version it was
read from (`sources`), as megatron-core's TransformerConfig documents each field. Where a
framework's behaviour changed across versions (torchtitan's loss, compiled since bbb1b616; the
transformers loss ColossalAI's Hugging Face models run), the version is the setup's
`training.runtime_version` (--runtime-version), defaulting to the newest read here.

Versions read (docs/framework-facts.md): Megatron-LM d98e8a64 (2026-08-22); torchtitan 9dec370
(2024-12-26), bbb1b616 (2025-04-02), 2c8b5947 (2025-08-08), b5bcd76c (2026-08-21); torch 2.13.0 (cf30153c); DeepSpeed
edaa7221 (2026-08-22); ColossalAI 4f9953be and its LLaMA-2 benchmark at 068372a7.

The loss region is a multiple of the bf16 logits tensor (tokens x vocab shard x 2 B): `kept` what
lives from the loss's forward to its backward (the logits themselves included where they stay),
`peak` the most at once during the loss's forward and backward. Measured with torch's MemTracker
on CPU (torch 2.13, 2,048 tokens x 4,096 vocab, bf16 logits; scripts/bench_loss_region.py,
its cases written from each framework's code): torchtitan's plain loss kept 2.00 peak 5.97
(compiled by inductor, read from its generated code instead, scripts/compiled_loss.py: kept 1.00
peak 2.00);
loss_parallel kept 2.00 peak 7.97; Hugging Face >= 4.46 (its output keeps the logits) kept 3.00
peak 6.97; transformers 4.3x as ColossalAI's benchmark runs it kept 4.00 peak 7.97; Megatron-LM's
vocab-parallel cross-entropy kept 2.00 peak 2.97.
"""

from __future__ import annotations

import functools
from dataclasses import fields

from planner.cost.runtime_facts import LossRegion, RuntimeFacts, compile_refused
from planner.errors import UserError

_MEGATRON_V = "Megatron-LM d98e8a64 (2026-08-22)"
_TORCH_V = "torch 2.13.0 (cf30153c)"
_TITAN_OLD = "torchtitan 9dec370 (2024-12-26)"
_TITAN_NEW = "torchtitan bbb1b616 (2025-04-02) to b5bcd76c (2026-08-21)"
# the torch each torchtitan version ran: 9dec370's benchmarks name torch 1963fc8 (2024-12-23;
# benchmarks/llama3_h100_202412_torchtitan.md); bbb1b616 ran the nightly of its day (2025-04), both
# before pytorch#153383 (2025-05-13) made output_chunks the last stage's only
_PIPELINING_OUTPUTS = "torch/distributed/pipelining/stage.py forward_one_chunk appends the output to output_chunks, schedules.py step() merges them (torch.cat) and returns them; clear_runtime_states empties them as the next step begins"
_TITAN_OUTPUTS = {
    "9dec370": ("every-stage", f"train.py 287-292 (pp_schedule.step(...) returns the merged outputs), {_TITAN_OLD}, "
                "with torch 1963fc8 (2024-12-23; benchmarks/llama3_h100_202412_torchtitan.md): "
                f"{_PIPELINING_OUTPUTS}; every stage appended its output until pytorch#153383 (2025-05-13)"),
    "bbb1b616": ("every-stage", "torchtitan/train.py (pp_schedule.step(...) without return_outputs), bbb1b616 "
                 f"(2025-04-02), on the torch nightly of its day: {_PIPELINING_OUTPUTS}; every stage appended its "
                 "output until pytorch#153383 (2025-05-13)"),
    "2c8b5947": ("last-stage", "torchtitan/train.py 429-435 (pp_schedule.step(...) without return_outputs), 2c8b5947 "
                 "(2025-08-08), on torch 2.9.0.dev20250811 (torchao's MI300X benchmarks, torchao/float8/README.md "
                 f"853f87d1): {_PIPELINING_OUTPUTS}; since pytorch#153383 (2025-05-13) the last stage's alone"),
    "b5bcd76c": ("none", "torchtitan/trainer.py 827-833 (pp_schedule.step(..., return_outputs=False)), b5bcd76c "
                 "(2026-08-21); since e5ef99aab (2025-10-22), with pytorch#165822's return_outputs"),
}
# FSDP2's units as each torchtitan applies them without a pipeline (its apply_fsdp), and what the
# torch it ran keeps gathered from the forward on: (grouping, gathered from forward, source)
_ROOT_CLAMP = ("FSDP2 kept the root unit gathered after its forward whatever reshard_after_forward said "
               "(torch/distributed/fsdp/_fully_shard/_fsdp_state.py _lazy_init: the root's "
               "post_forward_mesh_info = None) until pytorch#154704 (2025-06), after which only an "
               "automatic setting is clamped (_fsdp_state.py 205-207, torch 2.13.0 cf30153c)")
_TITAN_UNITS = {
    "9dec370": ("root-ends", ("first", "before-last"),
                f"torchtitan/parallelisms/parallelize_llama.py 324-339 (every TransformerBlock a unit, the last "
                f"with reshard_after_forward False without PP; then fully_shard(model): tok_embeddings, norm and "
                f"output the root unit), {_TITAN_OLD}, on torch 1963fc8 (2024-12-23); the same at 54ef4222 "
                f"(2025-03-12, torchao's H100 row: torchtitan/models/llama/parallelize_llama.py 346-369): "
                f"{_ROOT_CLAMP}"),
    "bbb1b616": ("root-ends", ("first", "before-last"),
                 "torchtitan/models/llama/parallelize_llama.py 351-374 (as 9dec370), bbb1b616 (2025-04-02), on the "
                 f"torch nightly of its day: {_ROOT_CLAMP}"),
    "2c8b5947": ("per-layer", ("last",),
                 "torchtitan/models/llama3/infra/parallelize.py 402-422 (tok_embeddings a unit, every block a unit "
                 "resharded after forward without PP, [norm, output] one unit resharded only under the policy "
                 "\"always\", then fully_shard(model) with no parameters left), 2c8b5947 (2025-08-08)"),
    "b5bcd76c": ("per-layer", ("last",),
                 "torchtitan/distributed/fsdp.py 234-266 (tok_embeddings a unit, [norm, lm_head] one unit not "
                 "resharded after forward unless \"always\"; tied weights put tok_embeddings in that unit, not "
                 "modelled), 290-368 (every block, then the root), b5bcd76c (2026-08-21)"),
}
# torchtitan's package version (assets/version.txt) names a span of commits whose records differ: a
# run that states only it is scored by the record of its commit, which the sentence helps to choose
_TITAN_PACKAGES = {
    "0.0.2": "every commit from b889f3d5 (2024-04-16) to b461ea82 (2025-06-05), over which the loss became "
             "compiled under training.compile (bbb1b616, 2025-04-02): give 9dec370 for a torchtitan before "
             "2025-04-02 (torchao's H100 float8 benchmarks of 2025-03-12 ran one), bbb1b616 from then",
    "0.1.0": "every commit from b461ea82 (2025-06-05) to 29624e37 (2025-10-17), each compiling the loss under "
             "compile: give 2c8b5947 (a pipeline's last stage keeps its outputs to the step's end with a torch "
             "from after pytorch#153383, 2025-05-13), or bbb1b616 with an earlier torch",
}
_DS_V = "DeepSpeed edaa7221 (2026-08-22)"
_CAI_V = "ColossalAI 4f9953be; LLaMA-2 benchmark 068372a7"
_MEMTRACKER = "measured: torch MemTracker on CPU, torch 2.13 (scripts/bench_loss_region.py)"

_TORCH_PIPELINING = dict(
    stage_input_in_receive_buffer=True, input_receive_buffers="per-microbatch",
    output_grad_buffers_per_microbatch=True, frees_sent_output=False, batch_held="whole-batch",
    sends_held_to_step_end=True,
)
_TORCH_PIPELINING_SOURCES = {
    "stage_input_in_receive_buffer": f"torch/distributed/pipelining/stage.py 902-916, {_TORCH_V}; measured on ckplan's runtime",
    "input_receive_buffers": f"torch/distributed/pipelining/stage.py 1285-1291, 1428, {_TORCH_V}",
    "output_grad_buffers_per_microbatch": f"torch/distributed/pipelining/stage.py 1285-1291, {_TORCH_V}",
    "frees_sent_output": f"torch/distributed/pipelining/stage.py 902-916, 966 (fwd_cache to the backward), {_TORCH_V}",
    "batch_held": f"torch/distributed/pipelining/schedules.py 489-499 (the whole batch split), {_TORCH_V}",
    "sends_held_to_step_end": "measured on ckplan's runtime (torch's _PipelineScheduleRuntime waits for sends at the step end)",
    "outputs_held_to_step_end": f"planner/runtime/worker.py 203 (schedule.step(..., return_outputs=False)); torch/distributed/pipelining/stage.py 906-908 (appended only where save_forward_output), {_TORCH_V}",
}

# The after-step facts (afterstep.py) where they were not read: nothing charged past the step.
_AFTER_STEP_NOT_READ = {
    "keeps_last_input_and_grad": "not read for this runtime (nothing charged after the step)",
    "te_cublas_workspace": "the runtime's layers are not Transformer Engine's",
    "step_whole_bytes": "not read for this runtime (nothing charged beside the optimizer's step)",
    "step_shard_bytes": "not read for this runtime (nothing charged beside the optimizer's step)",
}

# The layers' kernels where the runtime runs the model code's own ops: the profile's passes as they are
_MODEL_CODE_KERNELS = {"fused_kernels": "the model code's own ops (eager, or inductor's under --compile): the "
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
_COMPILED_LOSS = LossRegion(kept_x=1.0, peak_x=2.0)

# FSDP2's reduce-scatter state beside torch's pipelining (RuntimeFacts.keeps_last_reduce_scatter_input)
_RS_INPUT_KEPT = ("torch 2.6.0 (git 2236df17, the release of torch 1963fc8's month): pipelining/stage.py 636-652 "
                  "run_post_backward calls each FSDP2 group's post_backward but not the root's "
                  "_root_post_backward_final_callback, so fsdp/_fully_shard/_fsdp_param_group.py 408-437 leaves the "
                  "last group's reduce_scatter_input in comm_ctx.reduce_scatter_state until the next step's last "
                  "backward (_fsdp_state.py 302-308 drops it only in that callback); pytorch#144535 (2025-01-10) added "
                  "the call")
_RS_INPUT_DROPPED = ("torch since pytorch#144535 (2025-01-10) calls the root's _root_post_backward_final_callback after "
                     f"the pipeline's manual post-backward, which drops the reduce-scatter state (pipelining/stage.py "
                     f"1188-1191, {_TORCH_V})")
_NO_FSDP2_PIPELINE = "no FSDP2 beside a torch pipelining stage: its own data parallelism reduces its gradients"

_FLOAT8_NOT_READ = {"float8": "not read: the runtime's Float8 (if any) is refused",
                    "float8_memory": "not read: the runtime's Float8 (if any) is refused"}
_TORCHAO_V = "torchao v0.11.0 (f34b473e)"
_TE_V = "TransformerEngine v2.9"
# torch.compile of the model (--compile): who compiles it, and what runs where it is not compiled
_TITAN_COMPILES = {
    "9dec370": "torchtitan/parallelisms/parallelize_llama.py 70-77, 297-306 (training.compile: apply_compile, "
               "torch.compile of each TransformerBlock, fullgraph), 9dec370 (2024-12-26)",
    "bbb1b616": "torchtitan/models/llama/parallelize_llama.py 86-88, 308-320 (training.compile: apply_compile, each "
                "TransformerBlock), bbb1b616 (2025-04-02)",
    "2c8b5947": "torchtitan/models/llama3/infra/parallelize.py 95-97, 345-354 (training.compile: apply_compile, "
                "torch.compile of each TransformerBlock), 2c8b5947 (2025-08-08)",
    "b5bcd76c": "torchtitan/models/llama3/parallelize.py 42-55 (compile.enable with \"model\" in compile.components: "
                "apply_compile), torchtitan/distributed/compile.py 39-72 (each TransformerBlock .compile(fullgraph="
                "True)), b5bcd76c (2026-08-21)",
}
_NO_MODEL_COMPILE = {
    "ckplan": ("each stage's layers eager, as the model file builds them",
               "planner/runtime (stagemodule.py, worker.py, recompute.py): the stages run the model file's modules as "
               "built; nothing in planner/runtime calls torch.compile"),
    "megatron": ("Transformer Engine's fused layers eager (torch.compile only on the small fused elementwise functions "
                 "of its jit_fuser)",
                 f"megatron/training/arguments.py: no argument torch.compiles the model; megatron/core/jit.py 16-33 "
                 f"(jit_fuser = torch.compile on torch >= 2.2) decorates only fused elementwise functions "
                 f"(megatron/core/activations.py, megatron/core/fusions/fused_bias_*.py), {_MEGATRON_V}"),
    "deepspeed": ("the model eager (its config compiles nothing; torch.compile runs only where the training script "
                  "calls engine.compile())",
                  f"deepspeed/runtime/engine.py 5706-5756 (compile(): self.module.compile, run only when the script "
                  f"calls it); the config's `compile` block (deepspeed/runtime/config.py 919, deepspeed/compile/"
                  f"config.py 12-73) configures DeepCompile's passes for that call, {_DS_V}; Megatron-DeepSpeed "
                  "4efb479d (2025-07-16), whose GPT the record reads, calls neither engine.compile() nor torch.compile"),
    "colossalai": ("the Hugging Face model eager under its plugin (torch.compile only on its fp8 cast kernels and ring "
                   "attention's rescale)",
                   "colossalai/booster/plugin: no torch.compile of the model; torch.compile only in "
                   "colossalai/quantization/fp8.py 194-837 and colossalai/shardformer/layer/attn.py 375, 4f9953be; "
                   "examples/language/llama2/benchmark.py has no compile option, 068372a7"),
}


def _ckplan() -> RuntimeFacts:
    return RuntimeFacts(
        name="ckplan", version="ckplan (this repository) on " + _TORCH_V,
        grad_bytes=2, shard_weight_bytes=2, master_bytes=4, zero1_whole_tensors=True, zero_as_fsdp2=False, grads_allocated_at_first_backward=False,
        adam_step_scratch=True,
        # ckplan's runtime runs the model file's own loss, measured into the profile; an analytic
        # profile's formula (planner/profiler/analytic.py): logits kept, fp32 softmax kept, fp32 gradient
        loss=LossRegion(kept_x=3.0, peak_x=5.0), loss_vocab_parallel=LossRegion(kept_x=3.0, peak_x=5.0),
        loss_compiled=None, tp_saves_gathered_input=False,
        compiles_model=False, runs_instead=_NO_MODEL_COMPILE["ckplan"][0],
        **_TORCH_PIPELINING, recompute_whole_forward=False,
        overlaps_grad_reduce=False, prefetches_zero3_gathers=True, tp_overlap=None, cublas_workspace_bytes=None,
        step_replayed=True,
        sources={
            "step_replayed": "planner/cost/reserve.py replays planner/runtime/replay.py's and stagemodule.py's step",
            "keeps_last_reduce_scatter_input": f"planner/runtime/mesh.py 111-112 (FSDP2 under ZeRO 2/3) on {_TORCH_V}: "
                                               f"{_RS_INPUT_DROPPED}",
            "fsdp_units": "planner/runtime/mesh.py (fully_shard of every layer): the buffer term measured there "
                          "(scripts/bench_dp_static.py, dataparallel.unsharded_bytes)",
            "fsdp_gathered_from_forward": "none beyond the measured term: every layer resharded after forward",
            "grads_allocated_at_first_backward": "held in static as ckplan's runtime was measured (scripts/bench_dp_static.py)",
            "grad_bytes": "planner/runtime (torch .grad in the parameter's dtype); bf16 params under bf16-mixed",
            "shard_weight_bytes": "planner/runtime/mesh.py: bf16 parameters, fp32 master in the optimizer",
            "master_bytes": "planner/runtime/mesh.py: fp32 master under bf16-mixed",
            "zero1_whole_tensors": f"torch/distributed/optim/zero_redundancy_optimizer.py (greedy whole-tensor partition), {_TORCH_V}",
            "zero_as_fsdp2": "planner/runtime/mesh.py: ZeRO 2/3 by FSDP2 as the plan says",
            "adam_step_scratch": f"torch/optim/adam.py 553, 760-790 (_foreach_sqrt), {_TORCH_V}; measured on an H100 (docs/gpu-check.md)",
            "loss": "the profile's measured loss; analytic: planner/profiler/analytic.py (fp32 softmax kept, fp32 gradient)",
            "loss_vocab_parallel": "as loss",
            "loss_compiled": "ckplan's runtime does not compile",
            "compiles_model": _NO_MODEL_COMPILE["ckplan"][1],
            "runs_instead": _NO_MODEL_COMPILE["ckplan"][1],
            "tp_saves_gathered_input": "ckplan's runtime runs no TP; analytic profiles count 1/TP (Korthikanti et al. 2022)",
            **_TORCH_PIPELINING_SOURCES,
            "recompute_whole_forward": f"torch/utils/checkpoint.py non-reentrant with early stop (default), {_TORCH_V}",
            "overlaps_grad_reduce": "planner/runtime/mesh.py: ZeRO 0/1 reduce after the last backward",
            "prefetches_zero3_gathers": f"FSDP2 implicit prefetch, torch/distributed/fsdp/_fully_shard, {_TORCH_V}",
            "tp_overlap": "ckplan's runtime runs no TP",
            **_FLOAT8_NOT_READ,
            "cublas_workspace_bytes": "not sourced",
            "cp_comm": "planner/runtime runs no context parallelism (refused)",
            **_AFTER_STEP_NOT_READ,
            **_MODEL_CODE_KERNELS,
        })


def _megatron() -> RuntimeFacts:
    return RuntimeFacts(
        name="megatron", version=_MEGATRON_V,
        grad_bytes=4, shard_weight_bytes=2, master_bytes=4, zero1_whole_tensors=False, zero_as_fsdp2=False, grads_allocated_at_first_backward=False,
        adam_step_scratch=False,
        loss=LossRegion(kept_x=2.0, peak_x=3.0), loss_vocab_parallel=LossRegion(kept_x=2.0, peak_x=3.0),
        loss_compiled=None, tp_saves_gathered_input=False,
        compiles_model=False, runs_instead=_NO_MODEL_COMPILE["megatron"][0],
        stage_input_in_receive_buffer=False, input_receive_buffers="one", output_grad_buffers_per_microbatch=False,
        frees_sent_output=True, batch_held="in-flight-targets", sends_held_to_step_end=False,
        recompute_whole_forward=True, overlaps_grad_reduce=True, prefetches_zero3_gathers=True, tp_overlap="tp-comm-overlap",
        cublas_workspace_bytes=8 * 4096 * 1024, keeps_last_input_and_grad=True, te_cublas_workspace=True,
        step_whole_bytes=4, step_shard_bytes=4 + 4 + 2, cp_comm="p2p", float8="transformer-engine", float8_memory=False,
        fused_kernels="transformer-engine",
        sources={
            "fused_kernels": f"megatron/core/models/gpt/gpt_layer_specs.py (TELayerNormColumnParallelLinear: the norm "
                             f"inside linear_qkv / linear_fc1), megatron/core/fusions/fused_bias_swiglu.py, "
                             f"fused_bias_gelu.py (jit_fuser = torch.compile, megatron/core/jit.py), Megatron-LM "
                             f"6e091e1b; rope_utils.py 21 (TE's fused rotary under apply_rope_fusion), {_MEGATRON_V}; "
                             f"TE layernorm_linear.py 208, 955-966, {_TE_V} (planner/profiler/te_fused.py)",
            "cp_comm": f"megatron/training/arguments.py 3221 (--cp-comm-type default p2p); megatron/core/extensions/"
                       f"transformer_engine.py 2141-2153 (passed to TE), {_MEGATRON_V}; Transformer Engine "
                       "transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py "
                       "AttnFuncWithCPAndKVP2P 1356-2150 (forward), 2340-2420 (backward buffers), d0067d0d (2026-08-22)",
            "step_replayed": f"not replayed: Megatron-LM's schedules (megatron/core/pipeline_parallel/schedules.py, p2p on their own ops, deallocate_output_tensor) and Transformer Engine's kernels allocate in an order the replay does not run, {_MEGATRON_V}",
            "keeps_last_reduce_scatter_input": f"{_NO_FSDP2_PIPELINE} (the distributed optimizer's buckets, {_MEGATRON_V})",
            "grads_allocated_at_first_backward": f"megatron/core/distributed/param_and_grad_buffer.py 1066, 1168 (one buffer per model chunk, allocated at start, kept for the run), {_MEGATRON_V}",
            "grad_bytes": f"megatron/core/distributed/param_and_grad_buffer.py 895, 924 (fp32 main_grad); "
                          f"megatron/training/arguments.py 1204-1217 (bf16 forces fp32 accumulation), {_MEGATRON_V}",
            "shard_weight_bytes": f"megatron/core/distributed/param_and_grad_buffer.py (bf16 param buffer), {_MEGATRON_V}",
            "master_bytes": f"megatron/core/optimizer/distrib_optimizer.py (fp32 main params), {_MEGATRON_V}",
            "zero1_whole_tensors": f"megatron/core/optimizer/distrib_optimizer.py 200-243 (even flat bucket ranges), {_MEGATRON_V}",
            "zero_as_fsdp2": "Megatron-LM's DDP and distributed optimizer",
            "fsdp_units": "Megatron-LM's ZeRO is its distributed optimizer and Megatron-FSDP, not read as units: the largest-layer term kept",
            "fsdp_gathered_from_forward": "not read (the largest-layer term)",
            "adam_step_scratch": f"megatron/core/optimizer/__init__.py 14-20 (TE / apex FusedAdam), {_MEGATRON_V}",
            "loss": f"megatron/core/tensor_parallel/cross_entropy.py 20-26, 61-79, 139-185 (in-place exp, div; "
                    f"saves the fp32 softmax), {_MEGATRON_V}; {_MEMTRACKER}: kept 2.00, peak 2.97",
            "loss_vocab_parallel": "as loss (the same function over the vocab shard)",
            "loss_compiled": "Megatron-LM does not torch.compile the loss",
            "compiles_model": _NO_MODEL_COMPILE["megatron"][1],
            "runs_instead": _NO_MODEL_COMPILE["megatron"][1],
            "tp_saves_gathered_input": f"megatron/core/tensor_parallel/layers.py 604, 627-631, 667-682 "
                                       f"(saves the sharded input, re-gathers in backward), {_MEGATRON_V}",
            "stage_input_in_receive_buffer": f"megatron/core/pipeline_parallel/schedules.py (fresh input tensors), {_MEGATRON_V}",
            "input_receive_buffers": f"megatron/core/pipeline_parallel/schedules.py, {_MEGATRON_V}",
            "output_grad_buffers_per_microbatch": f"megatron/core/pipeline_parallel/schedules.py, {_MEGATRON_V}",
            "frees_sent_output": f"megatron/core/pipeline_parallel/schedules.py 171-190 (deallocate_output_tensor), {_MEGATRON_V}",
            "batch_held": f"megatron/core/pipeline_parallel/schedules.py (a microbatch per forward), {_MEGATRON_V}",
            "sends_held_to_step_end": f"megatron/core/pipeline_parallel/schedules.py, {_MEGATRON_V}",
            "outputs_held_to_step_end": f"megatron/core/pipeline_parallel/schedules.py 328-350 (the last stage keeps "
                                        f"each microbatch's reduced loss, not its output), 171-190 (sent outputs "
                                        f"deallocated), {_MEGATRON_V}",
            "recompute_whole_forward": f"megatron/core/tensor_parallel/random.py CheckpointFunction, {_MEGATRON_V}",
            "overlaps_grad_reduce": f"--overlap-grad-reduce, megatron/core/distributed/distributed_data_parallel.py, {_MEGATRON_V}",
            "prefetches_zero3_gathers": f"--overlap-param-gather, {_MEGATRON_V}",
            "tp_overlap": f"--tp-comm-overlap (Transformer Engine userbuffers), {_MEGATRON_V}",
            "float8": f"--fp8-format hybrid with --fp8-recipe tensorwise|delayed: Transformer Engine's Linear runs the "
                      f"forward, input-grad and weight-grad GEMMs in FP8 (transformer_engine/pytorch/module/"
                      f"linear.py 164-266, 312, 620-640, {_TE_V}); megatron/core/extensions/transformer_engine.py, "
                      f"{_MEGATRON_V}",
            "float8_memory": f"not read: TE's float8 weight workspaces (linear.py 240-266, get_weight_workspace, "
                             f"{_TE_V}) and its float8-saved inputs (linear.py 362-429) are not charged",
            "cublas_workspace_bytes": "tests/functional_tests/test_cases/gpt/gpt3_7b_tp*_memory_speed/model_config.yaml "
                                      "CUBLAS_WORKSPACE_CONFIG :4096:8 (8 x 4 MiB); torch allocates it through the "
                                      "caching allocator, one per handle and stream, the cuBLASLt one unified with it "
                                      "(aten/src/ATen/cuda/CublasHandlePool.cpp, getCUDABlasLtWorkspaceSize)",
            "keeps_last_input_and_grad": "megatron/core/pipeline_parallel/schedules.py 428-429 (forward_step: "
                                         "set_input_tensor(input_tensor)), 478-483 and 505-513 (backward_step: "
                                         "x.retain_grad(), input_tensor_grad = x.grad); megatron/core/transformer/"
                                         "transformer_block.py 440-448, 573 (self.input_tensor kept, the chunk's "
                                         "hidden states), Megatron-LM 6e091e1b (2026-05-30); the same at "
                                         f"{_MEGATRON_V} (schedules.py 507, 561, 591; transformer_block.py 463, 588)",
            "step_whole_bytes": "megatron/core/distributed/param_and_grad_buffer.py 313-349, 599-600 (check_grads: "
                                "each bucket's grad_data.norm before its reduction), on by default: "
                                "megatron/training/training.py 1910, arguments.py 2519-2521 "
                                "(--no-check-for-nan-in-loss-and-grad turns it off), Megatron-LM 6e091e1b",
            "step_shard_bytes": "--clip-grad defaults to 1.0 (arguments.py 2295-2296): the norm of the shard's fp32 "
                                "gradients; distrib_optimizer.py 2707-2795 (_copy_main_params_to_model_params: fp32 "
                                "main shard into the bf16 parameter buffer), Megatron-LM 6e091e1b",
            "te_cublas_workspace": "--transformer-impl transformer_engine (the test cases' model_config.yaml); "
                                   "transformer_engine/pytorch/cpp_extensions/gemm.py 34-60 (get_cublas_workspace, "
                                   "lru-cached per device), TransformerEngine f8a01cd5 (2026-05-29), the revision "
                                   "Megatron-LM 6e091e1b's pyproject.toml pins; the same at 4329ff84 (2026-08-04), "
                                   f"pinned at {_MEGATRON_V}",
        })


# torchtitan's step beside the optimizer's fused 28 B a parameter (the profile's step: read the fp32
# parameter, gradient, exp_avg, exp_avg_sq; write three), per parameter of the rank's fp32 shard:
# gradient clipping, every step (training.max_norm 1.0): get_total_norm's _foreach_norm reads the
# gradient (4 B), clip_grads_with_norm_'s _foreach_mul_ reads and writes it (8 B), whatever the norm
# (torch 2.13 torch/nn/utils/clip_grad.py 95, 173; torchtitan 9dec370 torchtitan/utils.py
# 348-404, train.py 311-316: foreach=True). At 9dec370 AdamW is foreach, not fused (optimizer.py
# 132-138): torch 2.13 torch/optim/adam.py 691-724, 770-799 (_multi_tensor_adam, not capturable) runs
# _foreach_mul_ on the parameters (weight decay 0.1: 8 B), lerp_ of exp_avg (12), mul_ and addcmul_
# of exp_avg_sq (8 + 12), sqrt into a new tensor (8), div_ and add_ on it (8 + 8), addcdiv_ into the
# parameters (16): 80 B, 52 beyond the fused kernel's 28. bbb1b616 and b5bcd76c default to fused
# (optimizer.implementation, b5bcd76c torchtitan/components/optimizer/optimizer.py 110-111).
_TITAN_CLIP_BYTES = 12
_TITAN_FOREACH_ADAMW_EXTRA_BYTES = 80 - 28


def _torchtitan(version: str) -> RuntimeFacts:
    compiles_loss = version != "9dec370"
    read_at = _TITAN_OLD if not compiles_loss else _TITAN_NEW
    return RuntimeFacts(
        name="torchtitan", version=version,
        grad_bytes=4, shard_weight_bytes=4, master_bytes=0, zero1_whole_tensors=False, zero_as_fsdp2=True, grads_allocated_at_first_backward=True,
        adam_step_scratch=version == "9dec370",
        loss=LossRegion(kept_x=2.0, peak_x=6.0), loss_vocab_parallel=LossRegion(kept_x=2.0, peak_x=8.0),
        loss_compiled=_COMPILED_LOSS if compiles_loss else None, tp_saves_gathered_input=True,
        compiles_model=True, runs_instead="",
        **_TORCH_PIPELINING, recompute_whole_forward=True, outputs_held_to_step_end=_TITAN_OUTPUTS[version][0],
        step_shard_bytes=_TITAN_CLIP_BYTES + (_TITAN_FOREACH_ADAMW_EXTRA_BYTES if version == "9dec370" else 0),
        overlaps_grad_reduce=True, prefetches_zero3_gathers=True, tp_overlap="async-tp", cublas_workspace_bytes=None,
        cp_comm="allgather", float8="torchao", float8_memory=True, keeps_last_reduce_scatter_input=version == "9dec370",
        fsdp_units=_TITAN_UNITS[version][0], fsdp_gathered_from_forward=_TITAN_UNITS[version][1],
        sources={
            "fsdp_units": _TITAN_UNITS[version][2],
            "fsdp_gathered_from_forward": _TITAN_UNITS[version][2],
            "cp_comm": f"torch/distributed/tensor/experimental/_context_parallel/_attention.py 77 (_cp_options."
                       f"rotate_method = ALL_GATHER), 273-300, 317-486 (forward), 488-655 (backward: dK/dV by "
                       f"all-to-all in fp32), {_TORCH_V}; torchtitan's experimental.context_parallel_rotate_method "
                       f"defaults to allgather at {_TITAN_OLD}; b5bcd76c keeps torch's default",
            "step_replayed": f"not replayed: FSDP2 allocates unsharded parameters and reduce-scatter inputs on its all-gather and reduce-scatter streams (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py FSDPCommContext), whose pools the replay does not run, {_TORCH_V}",
            "keeps_last_reduce_scatter_input": (f"{_RS_INPUT_KEPT}; {_TITAN_OLD} runs torch 1963fc8 (2024-12-23)"
                                                if version == "9dec370" else _RS_INPUT_DROPPED),
            "grads_allocated_at_first_backward": f"torch/distributed/fsdp/_fully_shard/_fsdp_param.py 802-820 (unsharded_accumulated_grad made in the first post-backward), _fsdp_param_group.py 605-611; torch/distributed/pipelining/stage.py 844-847, 1164-1177 (sync off until the last backward), {_TORCH_V}",
            "grad_bytes": f"torchtitan/parallelisms/parallelize_llama.py 91, 320 (reduce_dtype fp32), {_TITAN_OLD}; "
                          f"torch/distributed/fsdp/_fully_shard/_fsdp_param.py 802-820 (unsharded_accumulated_grad "
                          f"in reduce_dtype under PP), {_TORCH_V}",
            "shard_weight_bytes": f"torchtitan builds the model in fp32; FSDP2 MixedPrecisionPolicy(param_dtype=bf16) "
                                  f"casts when gathering, parallelize_llama.py 320, {_TITAN_OLD}",
            "master_bytes": "the fp32 sharded parameter is the master (no copy)",
            "zero1_whole_tensors": "torchtitan shards with FSDP2 only",
            "zero_as_fsdp2": f"parallelize_llama.py 324-339 (fully_shard every block; reshard_after_forward = not "
                             f"pp_enabled), {_TITAN_OLD}; torchtitan/distributed/fsdp.py 112-136, b5bcd76c; "
                             f"torch/distributed/pipelining/stage.py 844-847, {_TORCH_V}",
            "adam_step_scratch": f"torchtitan/optimizer.py 132-138 (foreach unless --optimizer.fused), {_TITAN_OLD}; "
                                 f"torch/optim/adam.py 760-790, {_TORCH_V}; fused AdamW by default since 6e498855 "
                                 f"(2025-02-24, config_manager.py --optimizer.implementation default \"fused\"; "
                                 f"bbb1b616 config_manager.py 240-243): torch._fused_adamw_ updates in place "
                                 f"(torch/optim/adam.py 802-877, {_TORCH_V}), no scratch",
            "loss": f"train.py 131-138 cross_entropy(pred.float()), `del pred` before backward, {_TITAN_OLD}; "
                    f"the same and still not compiled at 54ef4222 (2025-03-12; torchtitan/train.py 324-331, "
                    f"components/loss.py 10-18, its compile commented out), the torchtitan 0.0.2 of torchao's H100 "
                    f"float8 benchmarks (torchao 8c81863b); {_MEMTRACKER}: kept 2.00, peak 5.97",
            "loss_vocab_parallel": f"parallelize_llama.py 138-142 (loss_parallel), {_TITAN_OLD}; torch/distributed/"
                                   f"tensor/parallel/loss.py 197-222, {_TORCH_V}; {_MEMTRACKER}: kept 2.00, peak 7.97",
            "loss_compiled": f"train.py torch.compile(loss_fn) under training.compile, bbb1b616; "
                             f"torchtitan/components/loss.py 25-30, 2c8b5947; "
                             f"torchtitan/components/loss.py 242-252, b5bcd76c (none at {_TITAN_OLD}); "
                             f"inductor's generated code on CPU, torch 2.13 (scripts/compiled_loss.py): kept 1.00, "
                             f"peak 2.00 (the saved bf16 logits and their bf16 gradient)",
            "compiles_model": _TITAN_COMPILES[version],
            "runs_instead": "it compiles (compiles_model)",
            "tp_saves_gathered_input": f"parallelize_llama.py 117-191 (apply_tp), {_TITAN_OLD}; torch/distributed/"
                                       f"tensor/parallel/style.py 95-117 (redistribute to Replicate), {_TORCH_V}",
            **_TORCH_PIPELINING_SOURCES,
            "outputs_held_to_step_end": _TITAN_OUTPUTS[version][1],
            "recompute_whole_forward": "torchtitan/distributed/activation_checkpoint.py (early_stop=False), b5bcd76c",
            "overlaps_grad_reduce": f"FSDP2 reduce-scatter on its own stream, {_TORCH_V}",
            "prefetches_zero3_gathers": f"FSDP2 implicit forward / backward prefetch, {_TORCH_V}",
            "tp_overlap": f"--experimental.enable_async_tensor_parallel (torch._inductor micro-pipeline TP), {read_at}; "
                          f"what it fuses: torch/_inductor/fx_passes/micro_pipeline_tp.py 782-910, 957-1175, how the "
                          f"fused op runs: torch/distributed/_symmetric_memory/__init__.py 146-294, 325-440, 1254-1320, "
                          f"torch 2.13.0 (planner/cost/asynctp.py)",
            "float8": f"torchtitan/float8.py Float8Handler (every nn.Linear but `output`), {_TITAN_OLD}; "
                      f"torchtitan/components/quantization/float8.py, utils.py module_filter_fn, e7c0cae; "
                      f"torchao/float8/float8_linear.py 61-200 (three float8 GEMMs), {_TORCHAO_V}",
            "float8_memory": f"torchao/float8/float8_linear.py 77 (save_for_backward(input_hp, weight_hp_t)), 330-358 "
                             f"(the weight cast before it: the saved weight is float8), {_TORCHAO_V}",
            "cublas_workspace_bytes": "not sourced",
            **_AFTER_STEP_NOT_READ,
            "step_shard_bytes": "gradient clipping's foreach norm and multiply (12 B), torch/nn/utils/clip_grad.py 95, "
                                f"173, {_TORCH_V}; torchtitan/utils.py 348-404, train.py 311-316, {_TITAN_OLD}"
                                + ("; foreach AdamW's 52 B beyond the fused step (optimizer.py 132-138; torch/optim/"
                                   f"adam.py 691-724, 770-799, {_TORCH_V})" if version == "9dec370" else
                                   "; AdamW fused by default (b5bcd76c torchtitan/components/optimizer/optimizer.py "
                                   "110-111): the profile's step"),
            **_MODEL_CODE_KERNELS,
        })


def _deepspeed() -> RuntimeFacts:
    return RuntimeFacts(
        name="deepspeed", version=_DS_V,
        grad_bytes=2, shard_weight_bytes=2, master_bytes=4, zero1_whole_tensors=False, zero_as_fsdp2=False, grads_allocated_at_first_backward=False,
        adam_step_scratch=False,
        # Megatron-DeepSpeed's GPT runs Megatron's vocab-parallel cross-entropy
        loss=LossRegion(kept_x=2.0, peak_x=3.0), loss_vocab_parallel=LossRegion(kept_x=2.0, peak_x=3.0),
        loss_compiled=None, tp_saves_gathered_input=False,
        compiles_model=False, runs_instead=_NO_MODEL_COMPILE["deepspeed"][0],
        stage_input_in_receive_buffer=False, input_receive_buffers="pipe-buffers",
        output_grad_buffers_per_microbatch=False, frees_sent_output=False, batch_held="pipe-buffers",
        sends_held_to_step_end=False, recompute_whole_forward=True,
        overlaps_grad_reduce=True, prefetches_zero3_gathers=True, tp_overlap=None, cublas_workspace_bytes=None,
        sources={
            "step_replayed": f"not replayed: ZeRO's contiguous buffers and its side streams (deepspeed/runtime/zero/stage_1_and_2.py), {_DS_V}",
            "keeps_last_reduce_scatter_input": f"{_NO_FSDP2_PIPELINE} (its own ZeRO)",
            "grads_allocated_at_first_backward": f"deepspeed/runtime/bf16_optimizer.py 175-186 (flat gradient buffers allocated at start), {_DS_V}",
            "grad_bytes": f"deepspeed/runtime/engine.py 1485-1496 (grad_accum_dtype defaults to the model's), {_DS_V}",
            "shard_weight_bytes": f"deepspeed/runtime/bf16_optimizer.py 49-62 (bf16 flat groups), {_DS_V}",
            "master_bytes": f"deepspeed/runtime/bf16_optimizer.py 175-186 (fp32 partitions), {_DS_V}",
            "zero1_whole_tensors": f"deepspeed/runtime/bf16_optimizer.py (flat partition, even), {_DS_V}",
            "zero_as_fsdp2": "DeepSpeed's own ZeRO",
            "fsdp_units": "DeepSpeed ZeRO 3 gathers per submodule with its own prefetch bucket, not read as units: the largest-layer term kept",
            "fsdp_gathered_from_forward": "not read (the largest-layer term)",
            "adam_step_scratch": "deepspeed/runtime/engine.py _configure_basic_optimizer: FusedAdam for type Adam "
                                 "(multi-tensor, in place) unless torch_adam",
            "loss": "Megatron-DeepSpeed runs Megatron's vocab-parallel cross-entropy (see megatron's loss)",
            "loss_vocab_parallel": "as loss",
            "loss_compiled": "no compiled loss",
            "compiles_model": _NO_MODEL_COMPILE["deepspeed"][1],
            "runs_instead": _NO_MODEL_COMPILE["deepspeed"][1],
            "tp_saves_gathered_input": "Megatron-DeepSpeed's tensor-parallel layers save the sharded input",
            "stage_input_in_receive_buffer": f"deepspeed/runtime/pipe/engine.py (clones of the receive buffer), {_DS_V}",
            "input_receive_buffers": f"deepspeed/runtime/pipe/schedule.py 247-256 (num_pipe_buffers), {_DS_V}",
            "output_grad_buffers_per_microbatch": f"deepspeed/runtime/pipe/engine.py (one gradient buffer), {_DS_V}",
            "frees_sent_output": f"deepspeed/runtime/pipe/engine.py (outputs kept to their backward), {_DS_V}",
            "batch_held": f"deepspeed/runtime/pipe/engine.py (microbatches loaded into the pipe buffers), {_DS_V}",
            "sends_held_to_step_end": "DeepSpeed runs one stage per rank",
            "outputs_held_to_step_end": "not read beyond its pipe buffers (charged there): none charged",
            "recompute_whole_forward": "deepspeed/runtime/activation_checkpointing/checkpointing.py (reentrant)",
            "overlaps_grad_reduce": "DeepSpeed overlap_comm",
            "prefetches_zero3_gathers": "DeepSpeed ZeRO 3 prefetch bucket",
            "tp_overlap": "not in DeepSpeed",
            **_FLOAT8_NOT_READ,
            "cublas_workspace_bytes": "not sourced",
            "cp_comm": "DeepSpeed's sequence parallelism (Ulysses) not read (refused)",
            **_AFTER_STEP_NOT_READ,
            **_MODEL_CODE_KERNELS,
        })


def _colossalai(version: str) -> RuntimeFacts:
    hf_43x = version == "hf-4.3x"
    return RuntimeFacts(
        name="colossalai", version=version,
        grad_bytes=2, shard_weight_bytes=2, master_bytes=4, zero1_whole_tensors=False, zero_as_fsdp2=False, grads_allocated_at_first_backward=False,
        adam_step_scratch=False,
        loss=LossRegion(kept_x=4.0, peak_x=8.0) if hf_43x else LossRegion(kept_x=3.0, peak_x=7.0),
        loss_vocab_parallel=LossRegion(kept_x=4.0, peak_x=8.0) if hf_43x else LossRegion(kept_x=3.0, peak_x=7.0),
        loss_compiled=None, tp_saves_gathered_input=False,
        compiles_model=False, runs_instead=_NO_MODEL_COMPILE["colossalai"][0],
        stage_input_in_receive_buffer=False, input_receive_buffers="one", output_grad_buffers_per_microbatch=False,
        frees_sent_output=False, batch_held="every-stage", sends_held_to_step_end=False,
        recompute_whole_forward=True, overlaps_grad_reduce=True, prefetches_zero3_gathers=True, tp_overlap=None,
        cublas_workspace_bytes=None,
        sources={
            "step_replayed": "not replayed: Gemini's chunk manager allocates and moves whole chunks (colossalai/zero/gemini/chunk)",
            "keeps_last_reduce_scatter_input": f"{_NO_FSDP2_PIPELINE} (Gemini's chunks)",
            "grads_allocated_at_first_backward": f"colossalai/zero/gemini chunks (allocated at start), {_CAI_V}",
            "grad_bytes": f"colossalai/zero/gemini/gemini_ddp.py 106, 380-412 (grads in the fp16 chunk; a grad chunk "
                          f"with accumulation), {_CAI_V}",
            "shard_weight_bytes": f"colossalai/zero/gemini chunks (bf16 params), {_CAI_V}",
            "master_bytes": f"colossalai/zero/gemini/gemini_optimizer.py (fp32 master chunks), {_CAI_V}",
            "zero1_whole_tensors": f"colossalai/zero/low_level (flat, even partition), {_CAI_V}",
            "zero_as_fsdp2": "ColossalAI's own ZeRO / Gemini",
            "fsdp_units": "Gemini gathers whole chunks, not read as units: the largest-layer term kept",
            "fsdp_gathered_from_forward": "not read (the largest-layer term)",
            "adam_step_scratch": "examples/language/llama2/benchmark.py HybridAdam(model.parameters()), 068372a7; "
                                 "colossalai/nn/optimizer/hybrid_adam.py (fused multi-tensor Adam on the GPU)",
            "loss": ("transformers 4.3x LlamaForCausalLM: logits.float(), shifted .contiguous(), CrossEntropyLoss; "
                     f"the output keeps the fp32 logits; {_MEMTRACKER}: kept 4.00, peak 7.97") if hf_43x else
                    ("transformers >= 4.46 loss/loss_utils.py ForCausalLMLoss (upcast, shift, sum / items), the "
                     f"output keeps the bf16 logits; {_MEMTRACKER}: kept 3.00, peak 6.97"),
            "loss_vocab_parallel": "as loss",
            "loss_compiled": "no compiled loss",
            "compiles_model": _NO_MODEL_COMPILE["colossalai"][1],
            "runs_instead": _NO_MODEL_COMPILE["colossalai"][1],
            "tp_saves_gathered_input": "ColossalAI's shardformer linears (not read here; taken as Megatron's)",
            "stage_input_in_receive_buffer": "colossalai/pipeline/schedule/one_f_one_b.py 0.5",
            "input_receive_buffers": "colossalai/pipeline/schedule/one_f_one_b.py 0.5",
            "output_grad_buffers_per_microbatch": "colossalai/pipeline/schedule/one_f_one_b.py 0.5",
            "frees_sent_output": "colossalai/pipeline/schedule/one_f_one_b.py 0.5 (output_objs to the backward)",
            "batch_held": "colossalai/pipeline/schedule/one_f_one_b.py 0.5 (load_batch on every stage)",
            "sends_held_to_step_end": "one stage per rank",
            "outputs_held_to_step_end": "not read: none charged",
            "recompute_whole_forward": "examples/language/llama2/benchmark.py 162-163: HF gradient_checkpointing_enable "
                                       "(reentrant), 068372a7",
            "overlaps_grad_reduce": f"Gemini reduces chunks in the backward hooks, {_CAI_V}",
            "prefetches_zero3_gathers": f"Gemini chunk prefetch, {_CAI_V}",
            "tp_overlap": "not read",
            **_FLOAT8_NOT_READ,
            "cublas_workspace_bytes": "not sourced",
            "cp_comm": "not read (refused)",
            **_AFTER_STEP_NOT_READ,
            **_MODEL_CODE_KERNELS,
        })


# The versions a setup may name per runtime, newest (the default) first.
VERSIONS: dict[str, tuple[str, ...]] = {
    "ckplan": ("current",),
    "megatron": ("d98e8a64",),
    "torchtitan": ("b5bcd76c", "2c8b5947", "bbb1b616", "9dec370"),
    "deepspeed": ("edaa7221",),
    "colossalai": ("hf-4.46", "hf-4.3x"),
}


@functools.cache
def facts(runtime: str, version: str | None = None) -> RuntimeFacts:
    """The record of `runtime` at `version` (None: the newest read here). An unknown version is
    refused, naming the ones known."""
    known = VERSIONS.get(runtime)
    if known is None:
        raise UserError(f"unknown runtime {runtime!r}; one of {', '.join(VERSIONS)}")
    chosen = known[0] if version is None else version
    if runtime == "torchtitan" and chosen in _TITAN_PACKAGES:
        raise UserError(f"--runtime-version {version}: torchtitan {version} is the package version of "
                        f"{_TITAN_PACKAGES[version]}")
    if chosen not in known:
        raise UserError(f"--runtime-version {version} is not one read for {runtime}; use one of {', '.join(known)}")
    if runtime == "torchtitan":
        return _torchtitan(chosen)
    if runtime == "colossalai":
        return _colossalai(chosen)
    return {"ckplan": _ckplan, "megatron": _megatron, "deepspeed": _deepspeed}[runtime]()


def of(training) -> RuntimeFacts:
    """The record for a setup's training part (its runtime and runtime_version)."""
    return facts(training.runtime, getattr(training, "runtime_version", None))


def fact_fields() -> list[str]:
    """The fact fields (every field but the name, the version and the sources)."""
    return [f.name for f in fields(RuntimeFacts) if f.name not in ("name", "version", "sources")]


def loss_region(record: RuntimeFacts, *, tp: int, compiled: bool) -> LossRegion:
    """The loss region the runtime runs: on vocab-parallel logits under TP; else compiled where the
    setup compiles and the runtime compiles its loss; else the plain one."""
    if tp > 1:
        return record.loss_vocab_parallel
    if compiled and record.loss_compiled is not None:
        return record.loss_compiled
    return record.loss


def refused_settings(training, *, tp: int = 1) -> list[str]:
    """One sentence per setting of `training` the cost model does not model (none silently
    ignored): the command refuses the first; a config reader lists them all."""
    refused = compile_refused(training, of(training))
    record = of(training) if training.float8 or training.fp8_all_gather else None
    if training.float8 and record.float8 is None:
        refused.append(f"Float8 linears (--float8) are not modelled under --runtime {training.runtime}: its Float8 "
                       "was not read (torchtitan's torchao and Megatron-LM's Transformer Engine are)")
    if training.fp8_all_gather and not training.float8:
        refused.append("the float8 all-gather (--fp8-all-gather) gathers Float8 linears' weights: give --float8 too")
    elif training.fp8_all_gather and record.float8 != "torchao":
        refused.append(f"the float8 all-gather (--fp8-all-gather) is modelled as FSDP2's under torchao (--runtime "
                       f"torchtitan); {training.runtime}'s float8 parameter gather was not read")
    if training.context_parallel > 1 and of(training).cp_comm is None:
        refused.append(f"context parallelism (--cp {training.context_parallel}) is modelled as Megatron-LM and "
                       f"torchtitan run it; {training.runtime}'s runtime runs none: choose --runtime megatron or "
                       "torchtitan")
    if getattr(training, "cp_comm", None) is not None and training.context_parallel == 1:
        refused.append(f"--cp-comm {training.cp_comm} says how context-parallel ranks exchange K and V, and --cp is "
                       "1: give --cp N or drop --cp-comm")
    if training.chunked_cross_entropy:
        refused.append("chunked cross-entropy (--chunked-cross-entropy) is not modelled: the loss region is the "
                       "runtime's whole-logits one")
    if training.mtp_layers:
        refused.append(f"multi-token prediction (--mtp-layers {training.mtp_layers}) is not modelled: a profile "
                       "holds no MTP modules")
    if training.expert_tp is not None and training.expert_tp != tp:
        refused.append(f"expert tensor parallelism distinct from TP (--expert-tp {training.expert_tp} with TP {tp}) "
                       "is not modelled: the experts are split as the profile's TP splits them")
    return refused

