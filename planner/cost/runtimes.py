"""One record of facts per runtime: what each framework holds, in which dtype, and when it frees,
read from its code at a stated version. The cost terms read these records (planner/cost/rules.py,
dataparallel.py, chunked.py); no term tests a runtime's name.

Each field of RuntimeFacts is one fact; each record carries, per field, the file and version it was
read from (`sources`), as megatron-core's TransformerConfig documents each field. Where a framework's behaviour
changed across versions (torchtitan's loss, compiled since bbb1b616; the transformers loss ColossalAI's Hugging Face
models run), the version is the setup's `training.runtime_version` (--runtime-version), the newest read by default.
torchtitan's record, one per version, is planner/cost/runtime_titan.py, Megatron-LM's planner/cost/runtime_megatron.py; the facts of torch itself
that the records share (its pipelining, FSDP2 beside it, the compiled loss) planner/cost/runtime_shared.py.

Versions read (docs/framework-facts.md): Megatron-LM d98e8a64 (2026-08-22); torchtitan 9dec370
(2024-12-26), bbb1b616 (2025-04-02), 2c8b5947 (2025-08-08), b5bcd76c (2026-08-21); torch 2.13.0 (cf30153c); DeepSpeed
edaa7221 (2026-08-22) and 56c52238 (2022-04-19, as BLOOM 176B ran it: §61, §69); ColossalAI 4f9953be and its LLaMA-2
benchmark at 068372a7.
The loss regions the records state, and how they were measured: planner/cost/runtime_loss.py.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import fields

from planner.cost import (
    bridgesettings,
    runtime_deepspeed,
    runtime_fp16,
    runtime_megatron,
    runtime_titan,
)
from planner.cost.bridgesettings import BRIDGE_SETTINGS_NOT_READ as _BRIDGE_SETTINGS_NOT_READ
from planner.cost.record_refusals import compile_refused, test_mode_refused, timers_refused
from planner.cost.runtime_facts import LossRegion, RuntimeFacts
from planner.cost.runtime_shared import (
    AFTER_STEP_NOT_READ,
    EAGER_MOE_KEPT,
    EAGER_WGRAD,
    INPUT_GRADS_CLEARED,
    MEMTRACKER,
    MODEL_CODE_KERNELS,
    NO_CHUNKED_LOSS,
    RS_INPUT_DROPPED,
    TORCH_PIPELINING,
    TORCH_PIPELINING_SOURCES,
    TORCH_V,
)
from planner.cost.runtime_shared import NO_FSDP2_PIPELINE as _NO_FSDP2_PIPELINE
from planner.errors import UserError

_DS_V = "DeepSpeed edaa7221 (2026-08-22)"
_CAI_V = "ColossalAI 4f9953be; LLaMA-2 benchmark 068372a7"

_FLOAT8_NOT_READ = {"float8": "not read: the runtime's Float8 (if any) is refused",
                    "float8_memory": "not read: the runtime's Float8 (if any) is refused"}
_NO_MODEL_COMPILE = {
    "ckplan": ("each stage's layers eager, as the model file builds them",
               "planner/runtime (stagemodule.py, worker.py, recompute.py): the stages run the model file's modules as "
               "built; nothing in planner/runtime calls torch.compile"),
    "megatron": runtime_megatron.NO_MODEL_COMPILE,
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
        name="ckplan", version="ckplan (this repository) on " + TORCH_V, pipeline_schedules=("1F1B", "GPipe", "interleaved-1F1B", "ZB", "ZBV", "DualPipeV"),
        grad_bytes=2, shard_weight_bytes=2, master_bytes=4, zero1_whole_tensors=True, zero_as_fsdp2=False, grads_allocated_at_first_backward=False,
        adam_step_scratch=True,
        # ckplan's runtime runs the model file's own loss, measured into the profile; an analytic
        # profile's formula (planner/profiler/analytic.py): logits kept, fp32 softmax kept, fp32 gradient
        loss=LossRegion(kept_x=3.0, peak_x=5.0), loss_vocab_parallel=LossRegion(kept_x=3.0, peak_x=5.0),
        loss_compiled=None, tp_saves_gathered_input=False,
        compiles_model=False, runs_instead=_NO_MODEL_COMPILE["ckplan"][0],
        **TORCH_PIPELINING, recompute_whole_forward=False,
        overlaps_grad_reduce=False, prefetches_zero3_gathers=True, tp_overlap=None, cublas_workspace_bytes=None,
        step_replayed=True, fsdp_units="per-layer", cpu_collectives="gloo",
        sources={
            "cpu_collectives": "planner/runtime/launcher.py run_plan: gloo where the device is the CPU, NCCL on CUDA",
            "step_replayed": "planner/cost/reserve.py replays planner/runtime/replay.py's and stagemodule.py's step",
            "fsdp2_step_replayed": "ckplan's runtime shards with its own data parallelism (planner/runtime), not FSDP2's step",
            "megatron_step_replayed": "ckplan's runtime is not Megatron-LM: reserve.py replays its own step (step_replayed)",
            "expandable_segments": "ckplan's launch leaves PYTORCH_CUDA_ALLOC_CONF as the user set it: the default segments",
            "expandable_segments_across_nodes": "the same on every node",
            "input_grads_held_to_step_end": INPUT_GRADS_CLEARED,
            "keeps_last_reduce_scatter_input": f"planner/runtime/mesh.py 111-112 (FSDP2 under ZeRO 2/3) on {TORCH_V}: "
                                               f"{RS_INPUT_DROPPED}",
            "reduces_after_last_backward": "planner/runtime/mesh.py: ZeRO 2/3 kept whole reduce once after the last "
                                           "backward, charged whole already (overlaps_grad_reduce False)",
            "ddp_buckets": "not Megatron-LM's DDP (dataparallel.exposed_comm_ms charges its collectives)",
            "pipeline_schedules": "planner/runtime/worker.py runs torch.distributed.pipelining's schedules by name (get_schedule_class: Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble, ScheduleDualPipeV), " + f"{TORCH_V} (docs/framework-facts.md §251)",
            "stage_sends_beside": "not read (branch p2pcheck): its pipeline sends stay in the passes", "multi_schedule_lockstep": f"torch/distributed/pipelining/schedules.py 2216, 2891 (_PipelineScheduleRuntime), "
                                       f"{TORCH_V}",
            "fsdp_units": "planner/runtime/mesh.py data_parallel: fully_shard of every layer, the layers sharing a parameter one unit (_units), then of the stage (no parameters left), reshard_after_forward = ZeRO 3; charged per moment (planner/cost/fsdpunits.py, docs/framework-facts.md §329-§334), beside a 1F1B or GPipe pipeline over a stage's own layers, its stage reducing every microbatch (planner/runtime/timedstage.py; gathered.stage_unit_moments, §399-§401)",
            "fsdp_gathered_from_forward": "none: every unit resharded after its forward under ZeRO 3 (mesh.py data_parallel); under ZeRO 2 every unit stays gathered to its post-backward, charged whole in static",
            "grads_allocated_at_first_backward": "held in static as ckplan's runtime was measured (scripts/bench_dp_static.py)",
            "grad_bytes": "planner/runtime (torch .grad in the parameter's dtype); bf16 params under bf16-mixed",
            "shard_weight_bytes": "planner/runtime/mesh.py: bf16 parameters, fp32 master in the optimizer",
            "master_bytes": "planner/runtime/mesh.py: fp32 master under bf16-mixed",
            "zero1_whole_tensors": f"torch/distributed/optim/zero_redundancy_optimizer.py (greedy whole-tensor partition), {TORCH_V}",
            "zero_as_fsdp2": "planner/runtime/mesh.py: ZeRO 2/3 by FSDP2 as the plan says",
            "adam_step_scratch": f"torch/optim/adam.py 553, 760-790 (_foreach_sqrt), {TORCH_V}; measured on an H100 (docs/gpu-check.md)",
            "loss": "the profile's measured loss; analytic: planner/profiler/analytic.py (fp32 softmax kept, fp32 gradient)",
            "loss_vocab_parallel": "as loss",
            "loss_compiled": "ckplan's runtime does not compile",
            "compiles_model": _NO_MODEL_COMPILE["ckplan"][1],
            "runs_instead": _NO_MODEL_COMPILE["ckplan"][1],
            "tp_saves_gathered_input": "ckplan's runtime runs no TP; analytic profiles count 1/TP (Korthikanti et al. 2022)",
            **TORCH_PIPELINING_SOURCES,
            "recompute_whole_forward": f"torch/utils/checkpoint.py non-reentrant with early stop (default), {TORCH_V}",
            "overlaps_grad_reduce": "planner/runtime/mesh.py: ZeRO 0/1 reduce after the last backward",
            "prefetches_zero3_gathers": f"FSDP2 implicit prefetch, torch/distributed/fsdp/_fully_shard, {TORCH_V}",
            "tp_overlap": "ckplan's runtime runs no TP",
            **_FLOAT8_NOT_READ,
            **_BRIDGE_SETTINGS_NOT_READ, "chunked_loss": NO_CHUNKED_LOSS, "te_moe_experts_kept": EAGER_MOE_KEPT,
            **runtime_fp16.not_trained(runtime_fp16.CKPLAN_REFUSED), "wgrad_in_gemm": EAGER_WGRAD,
            "async_tp_workspace": "the runtime runs no AsyncTP (tp_overlap)",
            "tp_gathers_float8": "the runtime's TP linears are not torchao's Float8 ones",
            "float8_saves_input": "the runtime's linears are not torchao's Float8 ones",
            "cublas_workspace_bytes": "not sourced",
            "cp_comm": "planner/runtime runs no context parallelism (refused)",
            "cp_repeats_kv": "planner/runtime runs no context parallelism (refused)",
            "cp_compiled_waits_at_issue": "planner/runtime runs no context parallelism (refused)",
            "rotary_table": "a model file's buffers are its own (a measured profile counts them); not read for "
                            "analytic profiles on this runtime (nothing charged)",
            **AFTER_STEP_NOT_READ,
            **MODEL_CODE_KERNELS,
        })


def _deepspeed(version: str = "edaa7221") -> RuntimeFacts:
    record = _deepspeed_newest()
    if version == "edaa7221":
        return record
    sources = {**record.sources, **runtime_deepspeed.BLOOM_SOURCES, **runtime_deepspeed.BLOOM_NOT_READ,
               **runtime_fp16.not_trained(runtime_fp16.BLOOM_REFUSED)}
    return dataclasses.replace(record, version=runtime_deepspeed.DS_BLOOM, overlaps_grad_reduce=False, zero1_all_reduces=True,
                               hp_grad_accumulate_bytes=18, hp_grad_bytes=4, hp_grad_cast_bytes=4, reduce_cast_bytes=2, bf16_zero=1,
                               shard_group_zero=(), **runtime_deepspeed.BLOOM_FACTS, fp16_grad_bytes=0,
                               sources=sources)


def _deepspeed_newest() -> RuntimeFacts:
    return RuntimeFacts(
        name="deepspeed", version=_DS_V, pipeline_schedules=("1F1B",), **runtime_fp16.DEEPSPEED,
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
        pipeline_max_zero=1, shard_group_zero=(), fsdp_units="submodules", **runtime_deepspeed.STEP_FACTS,
        sources={
            "step_replayed": f"not by reserve.py's replay of ckplan's step: ZeRO 3's own on one stage (planner/cost/reserve_deepspeed.py, "
                             f"v0.6.2's stage3.py); ZeRO 1/2's contiguous buffers and side streams (stage_1_and_2.py) not replayed, {_DS_V}",
            "fsdp2_step_replayed": "DeepSpeed shards with ZeRO, not FSDP2",
            "megatron_step_replayed": f"not replayed: DeepSpeed's engine, not Megatron-LM's schedules and DDP (Megatron-DeepSpeed runs "
                                      f"DeepSpeed's PipelineEngine and ZeRO: step_replayed), {_DS_V}",
            "expandable_segments": "not read from its launch scripts: the default segments (ZeRO 3's replay runs them; ZeRO 1/2's "
                                   "reserve is the divisor's)",
            "expandable_segments_across_nodes": "not read from its launch scripts",
            "input_grads_held_to_step_end": "DeepSpeed's pipe engine takes one input gradient a pipe buffer (input_receive_buffers)",
            "keeps_last_reduce_scatter_input": f"{_NO_FSDP2_PIPELINE} (its own ZeRO)",
            "reduces_after_last_backward": f"{_NO_FSDP2_PIPELINE} (its own ZeRO)",
            "ddp_buckets": "not Megatron-LM's DDP (dataparallel.exposed_comm_ms charges its collectives)",
            "pipeline_schedules": "deepspeed/runtime/pipe/engine.py 386 (PipelineEngine.train_batch builds schedule.TrainSchedule, one stage a rank, 1F1B), DeepSpeed 38327e07 (docs/framework-facts.md §251)",
            "stage_sends_beside": "not read (branch p2pcheck): its pipeline sends stay in the passes", "multi_schedule_lockstep": "not torch's pipelining: DeepSpeed's PipelineEngine runs one stage per rank",
            "grads_allocated_at_first_backward": f"deepspeed/runtime/bf16_optimizer.py 175-186 (flat gradient buffers allocated at start), {_DS_V}",
            "grad_bytes": f"deepspeed/runtime/engine.py 1485-1496 (grad_accum_dtype defaults to the model's), {_DS_V}",
            "shard_weight_bytes": f"deepspeed/runtime/bf16_optimizer.py 49-62 (bf16 flat groups), {_DS_V}",
            "master_bytes": f"deepspeed/runtime/bf16_optimizer.py 175-186 (fp32 partitions), {_DS_V}",
            "zero1_whole_tensors": f"deepspeed/runtime/bf16_optimizer.py (flat partition, even), {_DS_V}",
            "zero_as_fsdp2": "DeepSpeed's own ZeRO",
            "fsdp_units": f"DeepSpeed ZeRO 3 gathers each submodule's own parameters as it runs and releases them by "
                          f"reuse distance in numel (deepspeed/runtime/zero/partitioned_param_coordinator.py 310-494, "
                          f"634-664, {_DS_V}; framework-facts §103, §105): no units, its coordinator simulated over the "
                          f"block's submodules at the setup's stage3 knobs (planner/cost/deepspeed_terms.py) where "
                          f"ckplan knows them (an analytic GPT block), the largest-layer term elsewhere",
            "cpu_collectives": "NCCL: the framework trains on GPUs alone",
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
            "batch_held": f"deepspeed/runtime/pipe/engine.py (microbatches loaded into the pipe buffers), {_DS_V}", "batch_positions": "not read: the model file's batch (inputs, targets), as ckplan profiles it",
            "sends_held_to_step_end": "DeepSpeed runs one stage per rank", "warmup_send_held": "its own TrainSchedule (no torch Schedule1F1B)", "loss_values_held": "its own TrainSchedule (not read: none charged)",
            "outputs_held_to_step_end": "not read beyond its pipe buffers (charged there): none charged",
            "logits_held_in_backward": f"deepspeed/runtime/pipe/engine.py (the last stage's outputs stay in its pipe "
                                       f"buffers to their backward), {_DS_V}",
            "recompute_whole_forward": "deepspeed/runtime/activation_checkpointing/checkpointing.py (reentrant)",
            "overlaps_grad_reduce": f"DeepSpeed with `overlap_comm` on: ZeRO 3's default, not ZeRO 0-2's (deepspeed/runtime/"
                                    f"zero/config.py 138, 383-386: None -> stage == 3), {_DS_V}; with it off ZeRO 0 and 1 "
                                    f"reduce after the backward (engine.py 2891-2913, stage_1_and_2.py 861-881) and ZeRO 2 "
                                    f"in its hooks on the compute stream (1349-1367), which no ckplan option selects (§103, §25.dsrows)",
            "prefetches_zero3_gathers": f"deepspeed/runtime/zero/partitioned_param_coordinator.py 453-485 "
                                        f"(fetch_sub_module: the trace's next parameters, at least one, up to "
                                        f"stage3_prefetch_bucket_size elements, gathered on the all-gather stream "
                                        f"beside the current submodule), {_DS_V}",
            "tp_overlap": "not in DeepSpeed",
            **_FLOAT8_NOT_READ,
            **_BRIDGE_SETTINGS_NOT_READ, "chunked_loss": NO_CHUNKED_LOSS, "te_moe_experts_kept": EAGER_MOE_KEPT,
            **runtime_fp16.DEEPSPEED_SOURCES, "wgrad_in_gemm": EAGER_WGRAD,
            "async_tp_workspace": "the runtime runs no AsyncTP (tp_overlap)",
            "tp_gathers_float8": "the runtime's TP linears are not torchao's Float8 ones",
            "float8_saves_input": "the runtime's linears are not torchao's Float8 ones",
            "cublas_workspace_bytes": "not sourced",
            "cp_comm": "DeepSpeed's sequence parallelism (Ulysses) not read (refused)",
            "cp_repeats_kv": "DeepSpeed's sequence parallelism (Ulysses) not read (refused)",
            "cp_compiled_waits_at_issue": "DeepSpeed's sequence parallelism (Ulysses) not read (refused)",
            "rotary_table": "the model's rotary table (Hugging Face's rotary embedding) not read (nothing charged)",
            **AFTER_STEP_NOT_READ,
            **MODEL_CODE_KERNELS, **runtime_deepspeed.SOURCES,
            "pipeline_max_zero": f"deepspeed/runtime/pipe/engine.py 76-78 (PipelineEngine.__init__: assert "
                                 f"zero_optimization_stage() < ZeroStageEnum.gradients, 'ZeRO-2 and ZeRO-3 are "
                                 f"incompatible with pipeline parallelism'), {_DS_V}",
            "shard_group_zero": f"none: ZeRO 1 and 2 partition over the whole data-parallel group (stage_1_and_2.py) "
                                f"and a smaller ZeRO 3 group is MiCS only (engine.py 2359-2470, _configure_zero_optimizer "
                                f"reads mics_shard_size in its ZeRO 3 branch, {_DS_V}), which DeepSpeed 0.19.8, the "
                                f"release after it, removed: runtime/config.py 119-141 (_REMOVED_ZERO_CONFIG_KEYS raises "
                                f"for mics_shard_size; deepspeedai/DeepSpeed#8489)",
        })


def _colossalai(version: str) -> RuntimeFacts:
    hf_43x = version == "hf-4.3x"
    return RuntimeFacts(
        name="colossalai", version=version, pipeline_schedules=("1F1B", "interleaved-1F1B", "ZBV"),
        grad_bytes=2, shard_weight_bytes=2, master_bytes=4, zero1_whole_tensors=False, zero_as_fsdp2=False, grads_allocated_at_first_backward=False,
        adam_step_scratch=False,
        loss=LossRegion(kept_x=4.0, peak_x=8.0) if hf_43x else LossRegion(kept_x=3.0, peak_x=7.0),
        loss_vocab_parallel=LossRegion(kept_x=4.0, peak_x=8.0) if hf_43x else LossRegion(kept_x=3.0, peak_x=7.0),
        loss_compiled=None, tp_saves_gathered_input=False,
        compiles_model=False, runs_instead=_NO_MODEL_COMPILE["colossalai"][0],
        stage_input_in_receive_buffer=False, input_receive_buffers="one", output_grad_buffers_per_microbatch=False,
        frees_sent_output=False, batch_held="every-stage", sends_held_to_step_end=False,
        recompute_whole_forward=True, overlaps_grad_reduce=True, prefetches_zero3_gathers=True, tp_overlap=None,
        cublas_workspace_bytes=None, pipeline_max_zero=1,
        sources={
            "step_replayed": "not replayed: Gemini's chunk manager allocates and moves whole chunks (colossalai/zero/gemini/chunk)",
            "fsdp2_step_replayed": "ColossalAI shards with Gemini, not FSDP2",
            "megatron_step_replayed": "not Megatron-LM's step: Gemini's chunks (step_replayed)",
            "expandable_segments": "not read from its launch scripts: the default segments (its reserve is the divisor's)",
            "expandable_segments_across_nodes": "not read from its launch scripts",
            "input_grads_held_to_step_end": "ColossalAI's 1F1B sends each input gradient as it is made (input_receive_buffers one)",
            "keeps_last_reduce_scatter_input": f"{_NO_FSDP2_PIPELINE} (Gemini's chunks)",
            "reduces_after_last_backward": f"{_NO_FSDP2_PIPELINE} (Gemini's chunks)",
            "ddp_buckets": "not Megatron-LM's DDP (dataparallel.exposed_comm_ms charges its collectives)",
            "pipeline_schedules": "ColossalAI's pipeline styles 1f1b, interleaved and zbv (planner/emit/colossalai.py's _STYLES, read at ColossalAI 4f9953be): docs/framework-facts.md §251",
            "stage_sends_beside": "not read (branch p2pcheck): its pipeline sends stay in the passes", "multi_schedule_lockstep": "not torch's pipelining: ColossalAI's own schedules",
            "grads_allocated_at_first_backward": f"colossalai/zero/gemini chunks (allocated at start), {_CAI_V}",
            "grad_bytes": f"colossalai/zero/gemini/gemini_ddp.py 106, 380-412 (grads in the fp16 chunk; a grad chunk "
                          f"with accumulation), {_CAI_V}",
            "shard_weight_bytes": f"colossalai/zero/gemini chunks (bf16 params), {_CAI_V}",
            "master_bytes": f"colossalai/zero/gemini/gemini_optimizer.py (fp32 master chunks), {_CAI_V}",
            "zero1_whole_tensors": f"colossalai/zero/low_level (flat, even partition), {_CAI_V}",
            "zero_as_fsdp2": "ColossalAI's own ZeRO / Gemini",
            "fsdp_units": "Gemini gathers whole chunks, not read as units: the largest-layer term kept",
            "cpu_collectives": "NCCL: the framework trains on GPUs alone",
            "fsdp_gathered_from_forward": "not read (the largest-layer term)",
            "adam_step_scratch": "examples/language/llama2/benchmark.py HybridAdam(model.parameters()), 068372a7; "
                                 "colossalai/nn/optimizer/hybrid_adam.py (fused multi-tensor Adam on the GPU)",
            "loss": ("transformers 4.3x LlamaForCausalLM: logits.float(), shifted .contiguous(), CrossEntropyLoss; "
                     f"the output keeps the fp32 logits; {MEMTRACKER}: kept 4.00, peak 7.97") if hf_43x else
                    ("transformers >= 4.46 loss/loss_utils.py ForCausalLMLoss (upcast, shift, sum / items), the "
                     f"output keeps the bf16 logits; {MEMTRACKER}: kept 3.00, peak 6.97"),
            "loss_vocab_parallel": "as loss",
            "loss_compiled": "no compiled loss",
            "compiles_model": _NO_MODEL_COMPILE["colossalai"][1],
            "runs_instead": _NO_MODEL_COMPILE["colossalai"][1],
            "tp_saves_gathered_input": "ColossalAI's shardformer linears (not read here; taken as Megatron's)",
            "stage_input_in_receive_buffer": "colossalai/pipeline/schedule/one_f_one_b.py 0.5",
            "input_receive_buffers": "colossalai/pipeline/schedule/one_f_one_b.py 0.5",
            "output_grad_buffers_per_microbatch": "colossalai/pipeline/schedule/one_f_one_b.py 0.5",
            "frees_sent_output": "colossalai/pipeline/schedule/one_f_one_b.py 0.5 (output_objs to the backward)",
            "batch_held": "colossalai/pipeline/schedule/one_f_one_b.py 0.5 (load_batch on every stage)", "batch_positions": "not read: the model file's batch (inputs, targets), as ckplan profiles it",
            "sends_held_to_step_end": "one stage per rank", "warmup_send_held": "its own one_f_one_b.py schedule (no torch Schedule1F1B)", "loss_values_held": "its own one_f_one_b.py schedule (not read: none charged)",
            "outputs_held_to_step_end": "not read: none charged",
            "logits_held_in_backward": "not read: held (the stage output's 1x stays to the stage's backward's end)",
            "recompute_whole_forward": "examples/language/llama2/benchmark.py 162-163: HF gradient_checkpointing_enable "
                                       "(reentrant), 068372a7",
            "overlaps_grad_reduce": f"Gemini reduces chunks in the backward hooks, {_CAI_V}",
            "prefetches_zero3_gathers": f"Gemini chunk prefetch, {_CAI_V}",
            "tp_overlap": "not read",
            **_FLOAT8_NOT_READ,
            **_BRIDGE_SETTINGS_NOT_READ, "chunked_loss": NO_CHUNKED_LOSS, "te_moe_experts_kept": EAGER_MOE_KEPT,
            **runtime_fp16.not_trained(runtime_fp16.COLOSSALAI_REFUSED), "wgrad_in_gemm": EAGER_WGRAD,
            "async_tp_workspace": "the runtime runs no AsyncTP (tp_overlap)",
            "tp_gathers_float8": "the runtime's TP linears are not torchao's Float8 ones",
            "float8_saves_input": "the runtime's linears are not torchao's Float8 ones",
            "cublas_workspace_bytes": "not sourced",
            "cp_comm": "not read (refused)",
            "cp_repeats_kv": "not read (refused)",
            "cp_compiled_waits_at_issue": "not read (refused)",
            "rotary_table": "the model's rotary table (Hugging Face's rotary embedding) not read (nothing charged)",
            **AFTER_STEP_NOT_READ,
            **MODEL_CODE_KERNELS,
            "pipeline_max_zero": f"colossalai/booster/plugin/hybrid_parallel_plugin.py HybridParallelPlugin.__init__ (its "
                                 f"pipelines: if pp_size > 1: assert zero_stage <= 1), {_CAI_V}",
        })


# The versions a setup may name per runtime, newest (the default) first.
VERSIONS: dict[str, tuple[str, ...]] = {
    "ckplan": ("current",),
    "megatron": ("d98e8a64", runtime_megatron.BRIDGE_MCORE),  # the second: Megatron-Bridge 25.11's (TE v2.9)
    "torchtitan": ("b5bcd76c", "2c8b5947", "bbb1b616", "9dec370"),
    "deepspeed": ("edaa7221", "56c52238"),
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
    if runtime == "torchtitan" and chosen in runtime_titan.PACKAGES:
        raise UserError(f"--runtime-version {version}: torchtitan {version} is the package version of "
                        f"{runtime_titan.PACKAGES[version]}")
    if chosen not in known:
        raise UserError(f"--runtime-version {version} is not one read for {runtime}; use one of {', '.join(known)}")
    if runtime == "torchtitan":
        return runtime_titan.torchtitan(chosen)
    if runtime == "colossalai":
        return _colossalai(chosen)
    if runtime == "deepspeed":
        return _deepspeed(chosen)
    if runtime == "megatron" and chosen == runtime_megatron.BRIDGE_MCORE:
        return runtime_megatron.megatron_bridge()
    return {"ckplan": _ckplan, "megatron": runtime_megatron.megatron}[runtime]()


def of(training) -> RuntimeFacts:
    """The record for a setup's training part (its runtime and runtime_version)."""
    return _of(training.runtime, getattr(training, "runtime_version", None), getattr(training, "grad_reduce_bf16", False),
               getattr(training, "precision", None) == runtime_fp16.FP16)


@functools.cache
def _of(runtime: str, version: str | None, grad_reduce_bf16: bool, fp16: bool = False) -> RuntimeFacts:
    record = bridgesettings.with_settings(facts(runtime, version), grad_reduce_bf16=grad_reduce_bf16)
    return runtime_fp16.under_fp16(record) if fp16 else record


def fact_fields() -> list[str]:
    """The fact fields (every field but the name, the version and the sources)."""
    return [f.name for f in fields(RuntimeFacts) if f.name not in ("name", "version", "sources")]


def loss_region(record: RuntimeFacts, *, tp: int, compiled: bool, te_fused: bool = False,
                native_fused: bool = False) -> LossRegion:
    """The loss region the runtime runs: Transformer Engine's fused cross-entropy where the setup asks for it
    (te_fused) and the record reads it; the runtime's own fused one likewise (native_fused: Megatron-LM's
    --cross-entropy-loss-fusion, at any TP); on vocab-parallel logits under TP; else compiled where the
    setup compiles and the runtime compiles its loss; else the plain one."""
    if te_fused and record.te_cross_entropy is not None:
        return record.te_cross_entropy
    if native_fused and record.fused_cross_entropy is not None:
        return record.fused_cross_entropy
    if tp > 1:
        return record.loss_vocab_parallel
    if compiled and record.loss_compiled is not None:
        return record.loss_compiled
    return record.loss


def refused_settings(training, *, tp: int = 1) -> list[str]:
    """One sentence per setting of `training` the cost model does not model (none silently
    ignored): the command refuses the first; a config reader lists them all."""
    refused = compile_refused(training, of(training)) + timers_refused(training, of(training)) \
        + test_mode_refused(training, of(training))
    record = of(training) if training.float8 or training.fp8_all_gather else None
    if training.float8 and record.float8 is None:
        refused.append(f"Float8 linears (--float8) are not modelled under --runtime {training.runtime}: its Float8 "
                       "was not read (torchtitan's torchao and Megatron-LM's Transformer Engine are)")
    if training.fp8_all_gather and not training.float8:
        refused.append("the float8 all-gather (--fp8-all-gather) gathers Float8 linears' weights: give --float8 too")
    elif training.fp8_all_gather and record.float8 != "torchao" and not record.fp8_param_bytes:
        refused.append(f"the float8 all-gather (--fp8-all-gather) is modelled as FSDP2's under torchao (--runtime "
                       f"torchtitan); {training.runtime}'s float8 parameter gather was not read")
    if training.context_parallel > 1 and of(training).cp_comm is None:
        refused.append(f"context parallelism (--cp {training.context_parallel}) is modelled as Megatron-LM and "
                       f"torchtitan run it; {training.runtime}'s runtime runs none: choose --runtime megatron or "
                       "torchtitan")
    if getattr(training, "cp_comm", None) is not None and training.context_parallel == 1:
        refused.append(f"--cp-comm {training.cp_comm} says how context-parallel ranks exchange K and V, and --cp is "
                       "1: give --cp N or drop --cp-comm")
    refused += bridgesettings.refused(training, of(training)) + runtime_fp16.refused(training, of(training))
    if training.chunked_cross_entropy and not of(training).chunked_loss:
        which = (f"torchtitan {of(training).version} had none" if training.runtime == "torchtitan" else
                 f"--runtime {training.runtime} runs no such loss")
        refused.append(f"chunked cross-entropy (--chunked-cross-entropy {training.chunked_cross_entropy}) is "
                       f"torchtitan 0.3.0's ChunkedLossWrapper (--runtime torchtitan, version b5bcd76c); {which}")
    if getattr(training, "nccl_ring_simple", False) and not of(training).step_collectives:
        refused.append(f"--nccl-ring-simple says how NCCL runs a Megatron-LM step's scalar all-reduces; "
                       f"{training.runtime}'s record charges none: drop it or choose --runtime megatron")
    if training.mtp_layers:
        refused.append(f"multi-token prediction (--mtp-layers {training.mtp_layers}) is not modelled: a profile "
                       "holds no MTP modules")
    if getattr(training, "unfused_grad_accumulation", False) and not of(training).main_grad_hook:
        refused.append(f"--no-gradient-accumulation-fusion turns off Megatron-LM's fused weight-gradient "
                       f"accumulation; {training.runtime}'s runtime has none to turn off: drop it or choose "
                       "--runtime megatron")
    logged = [flag for flag, on in (("--log-params-norm", getattr(training, "log_params_norm", False)),
                                    ("--log-num-zeros-in-grad", getattr(training, "log_num_zeros_in_grad", False))) if on]
    if logged and not of(training).logged_read_shard_bytes:
        refused.append(f"{' and '.join(logged)} {'is' if len(logged) == 1 else 'are'} Megatron-LM's logging, read "
                       f"for --runtime megatron only; {training.runtime}'s was not read: drop "
                       f"{'it' if len(logged) == 1 else 'them'} or choose --runtime megatron")
    if getattr(training, "deterministic", False) and not of(training).fills_te_outputs:
        refused.append(f"--deterministic-mode is Megatron-LM's, read for --runtime megatron only (torch's NaN fill "
                       f"of Transformer Engine's outputs); {training.runtime}'s was not read: drop it or choose "
                       "--runtime megatron")
    if getattr(training, "local_layers", False) and not of(training).local_spec_buffer:
        refused.append(f"--local-layers is Megatron-LM's --transformer-impl local (Megatron-core's local spec), read "
                       f"for --runtime megatron only; {training.runtime}'s layers are its own: drop it or choose "
                       "--runtime megatron")
    stated_segments = getattr(training, "expandable_segments", None)
    if stated_segments is not None and not (of(training).fsdp2_step_replayed or of(training).step_replayed
                                            or of(training).megatron_step_replayed):
        flag = "--expandable-segments" if stated_segments else "--no-expandable-segments"
        refused.append(f"{flag} changes the caching allocator's replay, and {training.runtime}'s step is not replayed "
                       "(its reserve is the fragmentation margin's): drop it")
    if training.expert_tp is not None and training.expert_tp != tp:
        refused.append(f"expert tensor parallelism distinct from TP (--expert-tp {training.expert_tp} with TP {tp}) "
                       "is not modelled: the experts are split as the profile's TP splits them")
    return refused
