"""Megatron-LM's flags as data, for the reader in megatron.py: those that change neither memory
nor time, those that do and are not modelled, and those that ask for a setting the cost model
does not model (configs.PENDING). Flag names and defaults as megatron/training/arguments.py defines them
at NVIDIA/Megatron-LM d98e8a64ddf3 (2026-08-22)."""

from __future__ import annotations

from itertools import combinations

from planner.errors import UserError
from planner.models.configs import megatron_legacy
from planner.models.configs.megatron_env import (  # noqa: F401  (the launch's environment, read there; named here too)
    ALLOC_CONF,
    BRIDGE_RUNTIME_VERSION,
    BRIDGE_VERSION_NOTE,
    ENV_VALUES,
    ENV_VARS,
    LAUNCHER_NCCL,
    LAUNCHER_NVLS,
    PERF_ENV_VARS,
    alloc_conf,
    launch_disables_nvls,
    launch_expandable_segments,
    launch_forces_ring_simple,
    launch_settings,
    yaml_extras,
)

# Flags that change neither memory nor time: recognised and listed as "no effect on the plan".
NO_EFFECT = {
    **megatron_legacy.NO_EFFECT,
    "--use-mcore-models": "megatron-core model classes (the only ones in current Megatron-LM)",
    "--mtp-loss-scaling-factor": "the MTP losses' weight (a scalar; the MTP layers: --mtp-num-layers)",
    "--hysteresis": "fp16 loss scaling (a scalar)", "--loss-scale": "fp16 loss scaling (a scalar)",
    "--initial-loss-scale": "fp16 loss scaling (a scalar)", "--min-loss-scale": "fp16 loss scaling (a scalar)",
    "--loss-scale-window": "fp16 loss scaling (a scalar)", "--init-method-xavier-uniform": "initialisation",
    "--no-save-optim": "checkpointing", "--no-save-rng": "checkpointing", "--use-dist-ckpt": "checkpointing",
    "--override-ckpt-iteration": "checkpointing", "--train-data-path": "data path", "--valid-data-path": "data path",
    "--test-data-path": "data path", "--per-split-data-args-path": "data path", "--dataloader-type": "data loader",
    "--num-dataset-builder-threads": "data loader", "--mid-level-dataset-surplus": "data loader",
    "--object-storage-cache-path": "data path", "--disable-msc": "storage client", "--enable-msc": "storage client",
    "--no-one-logger": "logging", "--allow-ambiguous-pad-tokens": "tokenizer",
    "--sft-tokenizer-prompt-format": "tokenizer", "--enable-ft-package": "fault tolerance",
    "--calc-ft-timeouts": "fault tolerance",
    "--init-method-std": "initialisation scale", "--apply-layernorm-1p": "norm weight parameterisation (1 + w)",
    "--lr": "learning rate", "--min-lr": "learning rate", "--decoupled-lr": "learning rate",
    "--decoupled-min-lr": "learning rate", "--lr-decay-style": "learning-rate schedule",
    "--lr-decay-samples": "learning-rate schedule", "--lr-warmup-samples": "learning-rate schedule",
    "--lr-decay-iters": "learning-rate schedule", "--lr-warmup-iters": "learning-rate schedule",
    "--lr-warmup-fraction": "learning-rate schedule", "--lr-warmup-init": "learning-rate schedule",
    "--clip-grad": "gradient clipping threshold", "--weight-decay": "weight decay",
    "--adam-beta1": "Adam hyper-parameter", "--adam-beta2": "Adam hyper-parameter", "--adam-eps": "Adam hyper-parameter",
    "--train-samples": "run length", "--train-iters": "run length", "--exit-duration-in-mins": "run length",
    "--exit-interval": "run length", "--mock-data": "data source", "--tokenizer-type": "tokenizer",
    "--tokenizer-model": "tokenizer path", "--tiktoken-pattern": "tokenizer", "--vocab-file": "tokenizer path",
    "--merge-file": "tokenizer path", "--data-path": "data path", "--data-cache-path": "data path",
    "--split": "data split", "--no-create-attention-mask-in-dataloader": "data loader (flash attention needs no mask)",
    "--no-mmap-bin-files": "data loader", "--num-workers": "data loader workers", "--seed": "random seed",
    "--eval-iters": "evaluation", "--eval-interval": "evaluation", "--save-interval": "checkpointing",
    "--save": "checkpoint path", "--load": "checkpoint path", "--ckpt-format": "checkpoint format",
    "--tensorboard-dir": "logging path", "--log-interval": "logging", "--log-throughput": "logging",
    "--profile": "profiling (a few steps)", "--profile-step-start": "profiling", "--profile-step-end": "profiling",
    "--profile-ranks": "profiling", "--distributed-timeout-minutes": "timeout",
    "--calculate-per-token-loss": "loss normalisation", "--manual-gc": "Python garbage collection schedule",
    "--manual-gc-interval": "Python garbage collection schedule",
    "--rotary-percent": "rotary share of head dims (no bytes)",
    "--norm-epsilon": "norm epsilon", "--rotary-base": "rotary base", "--use-rope-scaling": "rope scaling",
    "--rope-scaling-factor": "rope scaling", "--max-position-embeddings": "rotary table length",
    # YaRN's rotary scaling of MLA (arguments.py at d98e8a64: --rotary-scaling-factor, --mscale, --mscale-all-dim)
    "--rotary-scaling-factor": "YaRN rotary scaling", "--mscale": "YaRN attention scale",
    "--mscale-all-dim": "YaRN attention scale",
    "--use-flash-attn": "flash attention",
    "--te-rng-tracker": "Transformer Engine's random-number tracker (needed by CUDA graphs: arguments.py 1451-1453 at "
                        "92c8482e)",
    "--no-position-embedding": "no learned position table (the rotary positions have no parameters)",
    "--distributed-backend": "communication backend (nccl)", "--logging-level": "logging",
    "--init-model-with-meta-device": "initialisation on the meta device (nothing kept in steady state)", "--use-persistent-ckpt-worker": "checkpointing",
    "--no-masked-softmax-fusion": "kernel fusion (the unfused attention's softmax)",
    "--no-bias-dropout-fusion": "kernel fusion (the eager add moves what the fused one does)",
    "--bias-swiglu-fusion": "kernel fusion (on by default: the record's fused_kernels)",
    "--ckpt-fully-parallel-save": "checkpointing", "--ckpt-fully-parallel-load": "checkpointing",
    "--async-save": "checkpointing", "--verify-integrity": "checkpointing (SHA-256 of the files at save and load: training_config.py 648-649, checkpointing.py 905, 1969 at d98e8a64)",
    "--no-load-optim": "checkpointing", "--no-load-rng": "checkpointing",
    "--finetune": "checkpointing", "--use-checkpoint-args": "checkpointing",
    "--use-checkpoint-opt_param-scheduler": "checkpointing (the learning-rate schedule taken from the checkpoint)", "--dist-ckpt-strictness": "checkpointing",
    "--wandb-project": "logging", "--wandb-exp-name": "logging", "--wandb-save-dir": "logging",
    "--eod-mask-loss": "loss mask", "--reset-position-ids": "data", "--reset-attention-mask": "data",
    "--use-cpu-initialization": "initialisation",
    "--no-async-tensor-model-parallel-allreduce": "kernel scheduling", "--moe-router-score-function": "router",
    "--moe-router-pre-softmax": "router", "--moe-router-topk-scaling-factor": "router",
    "--moe-router-enable-expert-bias": "router", "--moe-router-bias-update-rate": "router",
    "--moe-router-num-groups": "router", "--moe-router-group-topk": "router", "--moe-token-drop-policy": "router",
    "--moe-z-loss": "router loss", "--moe-per-layer-logging": "logging", "--moe-permute-fusion": "kernel fusion (TE's fused permute, planner/profiler/te_moe.py; without it timed the same)",
    "--moe-router-fusion": "kernel fusion (TE's fused top-k router, planner/profiler/te_moe.py; without it timed the same)",
    "--position-embedding-type": "position embedding (rope: no parameters)",
    # framework-facts §159
    "--auto-detect-ckpt-format": "checkpointing (the format of the checkpoint loaded)",
    "--no-ckpt-fully-parallel-save": "checkpointing (each rank's shard saved without the fully parallel split)",
    "--apply-rope-fusion": "TE's fused rotary, on by default (Megatron-LM's apply_rope_fusion; --no-rope-fusion turns it "
                           "off): what the record's fused_kernels time",
}
# Flags whose effect is what ckplan charges whatever the file says (framework-facts §159)
MODELLED = {
    **megatron_legacy.MODELLED,
    "--moe-router-force-load-balancing": "random routing (RandomSTE: normal logits, then the top-k; router.py, "
                                         "moe_utils.py): each expert's expected load equal, the balanced routing "
                                         "ckplan charges every router; the random splits' FP8 padding charged "
                                         "(te_moe_eager.py)",
}
# Flags Megatron-LM has in both forms: given false, read as the other form (framework-facts §159)
NEGATED = {"--apply-rope-fusion": "--no-rope-fusion"}
# Flag families of megatron/training/arguments.py at d98e8a64ddf3 a pretraining step does not run:
# inference serving, the in-process restart wrapper, job tags, autoresume
NO_EFFECT_FAMILIES = {"--inference-": "inference serving (not the training step)", "--fim-": "data (fill-in-the-middle)",
                      "--ft-": "fault tolerance (between steps)",
                      "--inprocess-": "in-process restart (fault handling between steps)",
                      "--app-tag-": "job tags", "--adlr-autoresume": "auto-resume between jobs"}
# Flag families that change the job in ways the cost model does not model: listed, not modelled
NOT_MODELLED_FAMILIES = {"--rl-": "reinforcement-learning training (rollouts and an inference engine beside the "
                                  "trainer)",
                         "--grpo-": "GRPO reinforcement learning (rollouts beside the trainer)",
                         "--logits-save-": "distillation: teacher logits written each step",
                         "--logits-load-": "distillation: teacher logits read and a KD loss each step",
                         "--muon-": "the Muon optimizer's settings (Adam and SGD are modelled)",
                         "--cuda-graph-": "CUDA graphs (static buffers per captured graph)"}
NO_EFFECT_PREFIXES = ("--dist-ckpt-", "--log-", "--wandb-", "--tensorboard-", "--one-logger", "--ckpt-", "--eval-", "--exit-",
                      "--lr-", "--save-", "--load-", "--data-", "--tokenizer-", "--profile-", "--straggler")
# Flags that change memory or time and the prediction leaves out, with what they are. Those that
# ask for a setting the cost model does not model go through configs.PENDING (PENDING_FLAGS below);
# those it models (--tp-comm-overlap, bf16 moments, --expert-tensor-parallel-size = TP) megatron.py reads.
# Megatron-DeepSpeed's flags for DeepSpeed's engine (its megatron/arguments.py and deepspeed.add_config_arguments)
# given without --deepspeed: Megatron-DeepSpeed then runs no DeepSpeed engine and the script is scored for
# Megatron-LM's runtime. With --deepspeed they are read with the ds_config (megatron_deepspeed.py, §27.dsllama).
_SEE_DEEPSPEED = ("without --deepspeed no DeepSpeed engine runs; add --deepspeed (the ds_config is then read and the "
                  "job scored under --runtime deepspeed), or score a profile with `ckplan evaluate --runtime deepspeed "
                  "--zero N` and the stage3 options (--stage3-max-reuse-distance, --stage3-prefetch-bucket-size, "
                  "--stage3-max-live-parameters)")
DEEPSPEED_NOT_MODELLED = {
    **megatron_legacy.NOT_MODELLED,
    "--deepspeed_config": f"the ds_config (ZeRO stage, offload, stage3 knobs): {_SEE_DEEPSPEED}",
    "--zero-stage": f"DeepSpeed's ZeRO stage (Megatron-DeepSpeed): {_SEE_DEEPSPEED}",
    "--deepspeed-activation-checkpointing": "DeepSpeed's activation checkpointing (deepspeed.checkpointing, reentrant) "
                                            f"for the layers Megatron-DeepSpeed checkpoints: {_SEE_DEEPSPEED}",
    "--no-pipeline-parallel": "Megatron-DeepSpeed's GPT without DeepSpeed's PipelineEngine (ZeRO 2 and 3 allowed): "
                              f"{_SEE_DEEPSPEED}",
}
NOT_MODELLED = {
    **DEEPSPEED_NOT_MODELLED,
    "--yaml-cfg": "more arguments in another YAML file, which is not read: give them in this file",
    "--fp16-lm-cross-entropy": "the cross-entropy on fp16 logits (fp16 runs): charged as the fp32 loss region",
    "--no-overlap-p2p-communication": "pipeline sends not overlapped with compute: time",
    "--ddp-num-buckets": "gradient-reduction bucket count: how much of the reduction overlaps the backward (time)",
    "--squared-relu": "a squared-ReLU MLP: scored as the MLP the other flags give (SwiGLU or GeLU)",
    "--openai-gelu": "OpenAI's GeLU approximation: the same tensors, another kernel (time)",
    "--no-check-for-nan-in-loss-and-grad": "the NaN check of every gradient bucket turned off: the runtime record's "
                                           "step_whole_bytes (4 B a parameter read once a step, planner/cost/runtimes.py) "
                                           "is timed all the same",
    "--no-bias-gelu-fusion": "the GeLU and its bias as eager ops: timed as Megatron's fused bias-GeLU all the same "
                             "(the record's fused_kernels, planner/profiler/te_fused.py)",
    "--no-bias-swiglu-fusion": "SwiGLU as eager ops: timed as the fused bias-SwiGLU all the same (the record's "
                               "fused_kernels), and kept as it (its input alone: the eager ops keep SiLU's output "
                               "too, planner/cost/te_kept.py)",
    "--no-rope-fusion": "rotary as eager ops: timed as TE's fused rotary all the same (the record's fused_kernels)",
    "--attention-softmax-in-fp32": "the unfused attention's softmax in fp32 (its scores are charged at 16 bits)",
    "--empty-unused-memory-level": "torch.cuda.empty_cache() calls during the step: lowers the reserved peak",
    "--distribute-saved-activations": "recomputed layers' inputs split over the TP group",
    "--optimizer-cpu-offload": "the optimizer on the host",
    "--use-torch-fsdp2": "PyTorch FSDP2 instead of the distributed optimizer",
    "--use-nccl-ub": "NCCL user buffers registered (more NCCL memory, faster collectives)",
    "--fsdp-double-buffer": "Megatron FSDP's double buffers, read under optim_grads_params only (they need its "
                            "units)",
    "--suggested-communication-unit-size": "Megatron FSDP's communication unit, read under optim_grads_params "
                                           "only",
    "--fsdp-manual-registration": "Megatron FSDP's manual buffer registration with NCCL",
    "--outer-dp-sharding-strategy": "HSDP's optimizer sharding across replicas (scored as replicated)",
    "--overlap-moe-expert-parallel-comm": "the all-to-all overlapped with compute (charged on the critical path)",
    "--defer-embedding-wgrad-compute": "the embedding's weight gradient deferred to overlap",
    "--rampup-batch-size": "a growing global batch (the final batch is scored)",
    "--step-batch-size-schedule": "a batch-size schedule (the final --global-batch-size is scored)",
    "--microbatch-group-size-per-virtual-stage": "interleaved schedule's microbatch grouping",
    "--moe-expert-capacity-factor": "token dropping at an expert capacity (the profile charges balanced routing)",
    "--moe-pad-expert-input-to-capacity": "expert inputs padded to capacity",
    "--moe-layer-recompute": "recompute of MoE layers",
    "--delay-wgrad-compute": "weight-gradient computation delayed",
    "--use-distributed-optimizer-instances": "distributed-optimizer instances",
    "--apply-query-key-layer-scaling": "the scores divided by the layer number and, as Megatron-core's "
                                       "TransformerConfig then sets attention_softmax_in_fp32, the unfused "
                                       "attention's softmax in fp32 (its scores charged at 16 bits); a scalar under "
                                       "fused attention",
    "--fine-grained-activation-offloading": "the activations of the --offload-modules copied to the host in the "
                                            "forward and back in the backward on a side stream: fewer kept bytes "
                                            "on the device, PCIe copies beside compute; scored keeping them on the "
                                            "device, no copy timed",
    "--offload-modules": "the modules --fine-grained-activation-offloading moves to the host (see it)",
    "--use-transformer-engine-op-fuser": "the MLP built from TE's fusible ops (te.ops.Sequential: its own fused "
                                         "kernels and saved tensors; with NVTE_CUTEDSL_FUSED_GROUPED_MLP a CuTe DSL "
                                         "grouped MLP): timed and kept as TE's modules",
    "--use-precision-aware-optimizer": "TE's FusedAdam keeps the fp32 master as the 16 bits the bf16 weights lack "
                                       "(store_param_remainders, megatron/core/optimizer/optimizer_config.py 192 at "
                                       "d98e8a64ddf3): charged as a whole fp32 master",
}
PENDING_FLAGS = {
    "--fp8-format": "float8", "--fp8": "float8", "--fp8-recipe": "float8", "--fp8-amax-history-len": "float8",
    "--fp8-amax-compute-algo": "float8", "--fp8-margin": "float8", "--fp8-param-gather": "fp8-all-gather",
    "--cp-comm-type": "cp", "--hierarchical-context-parallel-sizes": "cp",
    "--expert-tensor-parallel-size": "etp",
    "--main-grads-dtype": "bf16-optimizer-states", "--main-params-dtype": "bf16-optimizer-states",
    "--exp-avg-dtype": "bf16-optimizer-states", "--exp-avg-sq-dtype": "bf16-optimizer-states",
    "--grad-reduce-in-bf16": "bf16-grad-reduce",
}
# when the value makes them a no-op (the default), they are modelled exactly
PENDING_DEFAULTS = {"--main-grads-dtype": "fp32",
                    "--main-params-dtype": "fp32", "--exp-avg-dtype": "fp32", "--exp-avg-sq-dtype": "fp32"}
# GPT-2's BPE vocabulary (Radford et al. 2019; encoder.json of openai/gpt-2), which a --vocab-file with
# --merge-file gives Megatron-LM's GPT2BPETokenizer
GPT2_VOCAB = 50257
# --tokenizer-type values whose vocabulary is fixed: Llama 2's sentencepiece model (meta-llama/Llama-2-7b-hf
# config.json vocab_size 32000), GPT-2's BPE
TOKENIZER_VOCAB = {"Llama2Tokenizer": 32000, "GPT2BPETokenizer": GPT2_VOCAB}
TOKENIZER_SOURCE = "Llama 2: meta-llama/Llama-2-7b-hf config.json; GPT-2: openai/gpt-2 encoder.json"
# --attention-backend values whose kernel keeps the s x s scores (megatron/core/transformer/enums.py
# AttnBackend: flash, fused, unfused, local, auto; unfused and local are the PyTorch softmax path)
EAGER_BACKENDS = ("unfused", "local")
# megatron-core 0.16's --recompute-modules (planner/emit/megatron.py _MODULES, its inverse)
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)
# Megatron FSDP's --data-parallel-sharding-strategy (megatron/training/arguments.py, default
# optim_grads_params) as the ZeRO stage the cost model charges
FSDP_ZERO = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}


# megatron-core 0.16's recompute_modules as ckplan's recompute parts (planner/runtime/recompute.py):
# (module, part, on dense decoder layers, on MoE layers). transformer_layer.py recomputes "mlp"
# on dense layers only, moe_layer.py "moe" on MoE layers, experts.py "moe_act" (the experts'
# activation, output-discarding) on MoE layers; "layernorm" is both norms, output-discarding (their
# outputs freed too): the analytic blocks' norm-out (the norms megatron-core's TE layer builds as modules
# of their own, analytic_kept.selective_options), on a measured profile ckplan's norm (which keeps the
# outputs: the safe side); the two are alternatives (norm_alternative).
# "core_attn" is the attention kernel alone, Q, K and V kept: ckplan's core-attn (analytic profiles); ckplan's
# attn checkpoints the whole attention module, which no module list says (framework-facts §82).
# "shared_experts" (Megatron-LM d98e8a64 transformer_config.py 560-584: the MoE layer's shared experts,
# normal checkpointing) is a part no ckplan profile offers alone; "moe" checkpoints the whole MoE layer,
# shared experts with it (moe_layer.py), so with "moe" it adds nothing, as "moe_act" adds nothing inside it.
RECOMPUTE_MODULES = (("core_attn", "core-attn", True, True), ("mla_up_proj", "mla-up", True, True), ("mlp", "mlp", True, False),
            ("moe", "mlp", False, True), ("moe_act", "mlp-act", False, True), ("layernorm", "norm-out", True, True),
            ("layernorm", "norm", True, True),
            ("shared_experts", "shared-experts", False, True))
OPTION_PARTS = ("core-attn", "mla-up", "mlp", "mlp-act", "norm", "norm-out")  # the order ckplan's option names join them in
# --recompute-modules' choices at Megatron-LM d98e8a64 (transformer_config.py 1944-1962; anything else is
# an assertion there), and those for attention and connections ckplan does not build (GatedDeltaNet,
# GatedDeltaProduct, hyper-connections: transformer_config.py 560-584)
MEGATRON_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts", "gdn_norm_out",
                    "gdp_in_proj", "gdp_qkv", "mhc")
UNBUILT_MODULES = ("gdn_norm_out", "gdp_in_proj", "gdp_qkv", "mhc")


def recompute_modules_option(modules, moe: bool, offered: set[str] | None = None) -> str:
    """The ckplan option a module list gives a layer ("none" where no module applies); layernorm as
    norm-out, or as norm where the layer's `offered` options have norm and no norm-out."""
    parts = {part for module, part, dense_ok, moe_ok in RECOMPUTE_MODULES if module in modules and (moe_ok if moe else dense_ok)}
    parts -= {norm_alternative(offered)}
    return ",".join(part for part in OPTION_PARTS if part in parts) or "none"


def norm_alternative(offered: set[str] | None) -> str:
    """Of layernorm's two parts, the one a layer offering `offered` does not take: norm where it offers
    norm-out or offers neither (analytic blocks), norm-out where it offers only ckplan's norm (measured)."""
    has = {part for name in offered or () for part in name.split(",")}
    return "norm-out" if "norm" in has and "norm-out" not in has else "norm"


def check_recompute_modules(modules) -> None:
    """One sentence for a --recompute-modules name Megatron-LM refuses, or one for a block ckplan does not build."""
    for module in modules:
        if module not in MEGATRON_MODULES:
            raise UserError(f"--recompute-modules {module!r} is not one of Megatron-LM's ({', '.join(MEGATRON_MODULES)}; "
                            "d98e8a64 transformer_config.py), which refuses it; fix the name")
        if module in UNBUILT_MODULES:
            raise UserError(f"--recompute-modules {module} recomputes part of a block ckplan does not build "
                            "(GatedDeltaNet, GatedDeltaProduct or hyper-connections); drop it, the model ckplan "
                            "scores has none")


def module_parts(modules, moe: bool) -> list[str]:
    """The parts the module list recomputes in a dense or a MoE decoder layer, what another part covers
    left out: on a MoE layer "moe" (mlp) reruns the whole layer, its experts' activation (moe_act) and
    its shared experts with it."""
    parts = [part for module, part, dense_ok, moe_ok in RECOMPUTE_MODULES
             if module in modules and (moe_ok if moe else dense_ok)]
    if moe and "mlp" in parts:
        parts = [part for part in parts if part not in ("mlp-act", "shared-experts")]
    return list(dict.fromkeys(parts))


def selective_stages(stages: list, profile, decoder: set[str], modules, notes: list[str]) -> list:
    """The stages with every decoder layer on the option its parts give it (module_parts, layer_option),
    and a note per layer kind on the parts its profile does not offer, which it is scored keeping."""
    chosen, left, fused = {}, {}, set()
    for layer in profile.layers:
        if layer.name in decoder:
            moe = layer.kind == "moe_block" or layer.kind == "mtp" and layer.expert_param_count > 0  # an MTP layer's block
            offered = {option.name for option in layer.recompute_options}
            parts = [part for part in module_parts(modules, moe) if part != norm_alternative(offered)]
            chosen[layer.name], dropped = layer_option(parts, offered)
            if "norm-out" in dropped and profile.source == "analytic":  # Megatron's layernorm is a no-op there
                dropped.remove("norm-out")
                fused.add(layer.kind)
            if dropped:
                said = list(dict.fromkeys(module for module, part, dense_ok, moe_ok in RECOMPUTE_MODULES
                                          if part in dropped and module in modules and (moe_ok if moe else dense_ok)))
                left.setdefault(layer.kind, (said, chosen[layer.name]))
    for kind, (said, option) in left.items():
        notes.append(f"selective recompute of {' '.join(modules)}: the profile's {kind} layers offer no recompute of "
                     f"{', '.join(said)}; scored as {option}, keeping what {'it' if len(said) == 1 else 'they'} "
                     "would free" + ("; layernorm discards both norms' outputs and recomputes them (Megatron-LM "
                                     "d98e8a64 transformer_layer.py 470-531)" if "layernorm" in said else ""))
    for kind in sorted(fused):
        notes.append(f"selective recompute of {' '.join(modules)}: layernorm frees nothing on the profile's {kind} "
                     "layers, whose norms megatron-core's Transformer Engine layer fuses into the linears after them "
                     "(IdentityOp norms: Megatron-LM d98e8a64 transformer_layer.py 474-479, 522-527; gpt_layer_specs.py)")
    return [s.with_recompute({n: chosen[n] for n in s.layers if chosen.get(n, "none") != "none"}) for s in stages]


def layer_option(parts: list[str], offered: set[str]) -> tuple[str, list[str]]:
    """(the option a layer takes for `parts`, the parts it leaves out): each part the layer offers in
    some option is kept, the others left out (the layer keeps what they would free: the safe side);
    the kept parts' combination where the layer offers it, else the largest offered one of them."""
    kept = [part for part in OPTION_PARTS if part in parts and any(part in name.split(",") for name in offered)]
    for size in range(len(kept), 0, -1):
        for combo in combinations(kept, size):
            if ",".join(combo) in offered:
                return ",".join(combo), [part for part in parts if part not in combo]
    return "none", list(parts)


def read_normalization(flags, *, gated: bool) -> None:
    """--normalization (Megatron-core's TransformerConfig.normalization: LayerNorm or RMSNorm, LayerNorm by default;
    transformer_config.py 256 at d98e8a64). The reader builds the norm with the block its MLP makes (gated: a
    LLaMA-style block's RMSNorm; else a GPT block's LayerNorm), so the other kind is listed not modelled, with
    what differs; Megatron-LM's default under a gated MLP, not given, is said in the notes."""
    built = "RMSNorm" if gated else "LayerNorm"
    block = "a gated MLP's LLaMA-style block" if gated else "a GPT block (no --swiglu)"
    differs = (f"charged as {built}, the norm of {block}: a LayerNorm's bias (h parameters a norm, with their "
               "gradients and optimizer state) and its kept mean (4 B a token a norm) are what the two kinds differ by")
    given = "--normalization" in flags.given
    kind = flags.take("--normalization", f"norm kind: {built}, the norm of {block}", str, "LayerNorm")
    if kind.lower() == built.lower():
        return
    if given:
        flags.sink[-1] = (*flags.sink[-1][:2], "not modelled", differs)
    else:
        flags.notes.append(f"--normalization LayerNorm (Megatron-LM's default) with a gated MLP: {differs}")
