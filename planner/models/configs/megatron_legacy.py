"""Megatron-LM flags the reader once listed "unknown", each read from megatron/training/arguments.py and the code
that reads it at NVIDIA/Megatron-LM d98e8a64ddf3 (2026-08-22):

- retired flags Megatron-LM refuses (validate_args 591-605: an assert, or --checkpoint-activations' exit()),
  refused here in one sentence naming what replaces each;
- the encoder forms of --num-layers and --seq-length (validate_args 1304-1311, 1346-1351: given without the
  other, it is the other; given with it, an assert), read as the flag they stand for;
- flags no pretrain_gpt.py step reads: those read by no code but arguments.py itself (`git grep -w DEST`
  over the tree at that commit, tests aside), another trainer's (BERT, T5, ICT/REALM, vision, multimodal) and
  the inference engine's ("no effect");
- flags that change a GPT step's memory or time, with what the prediction leaves out ("not modelled")."""

from __future__ import annotations

from planner.errors import UserError
from planner.models.configs.megatron_args import cast_value, positive
from planner.models.configs.megatron_files import check_hybrid

# arguments.py 591-605: each an assert (or exit) in validate_args, with the flag that replaces it
RETIRED = {
    "--batch-size": "--micro-batch-size",
    "--warmup": "--lr-warmup-fraction (or --lr-warmup-iters, --lr-warmup-samples)",
    "--model-parallel-size": "--tensor-model-parallel-size",
    "--checkpoint-activations": "--recompute-activations, or --recompute-granularity with --recompute-method",
}
# Megatron-DeepSpeed's own flags (megatron_flags.DEEPSPEED_NOT_MODELLED's and --deepspeed): its arguments.py takes
# --checkpoint-activations (every layer recomputed), with DeepSpeed's engine or without it
MEGATRON_DEEPSPEED = ("--deepspeed", "--deepspeed_config", "--zero-stage", "--deepspeed-activation-checkpointing",
                      "--no-pipeline-parallel")
# validate_args 1304-1311 and 1346-1351: the encoder's flag is the decoder-only model's when that is not given
ALIASES = {"--encoder-num-layers": "--num-layers", "--encoder-seq-length": "--seq-length"}
# validate_args 1625-1627: the legacy rotary flag sets --position-embedding-type rope, whatever that says
ROTARY = "--use-rotary-position-embeddings"
# how the reader lists the flags it reads as others (megatron_flags.MODELLED)
MODELLED = {**{flag: f"read as {instead}, as Megatron-LM reads it where {instead} is not given (validate_args "
                     "1304-1311, 1346-1351 at d98e8a64)" for flag, instead in ALIASES.items()},
            ROTARY: "read as --position-embedding-type rope, as Megatron-LM sets it (arguments.py 1625-1627 at d98e8a64)",
            # megatron/core/optimizer/__init__.py 622-627: TE's or apex's FusedSGD with this momentum
            "--sgd-momentum": "SGD's momentum: a momentum buffer a parameter charged"}

_NONE = "read by no Megatron-LM code at d98e8a64 but arguments.py"
_BERT = "BERT and T5 pretraining's data (examples/bert/pretrain_bert.py, examples/t5/pretrain_t5.py only)"
_SERVE = "inference serving (megatron/core/inference, the text-generation server), not the training step"
NO_EFFECT = {
    **{flag: f"{what}: {_NONE}" for flag, what in {
        "--bert-load": "ICT/REALM's BERT checkpoint", "--ict-load": "ICT's checkpoint",
        "--ict-head-size": "ICT's block embedding", "--biencoder-projection-dim": "the biencoder's projection",
        "--biencoder-shared-query-context-model": "the biencoder's sharing", "--block-data-path": "REALM's data",
        "--embedding-path": "REALM's embeddings", "--evidence-data-path": "retrieval data",
        "--titles-data-path": "ICT's titles", "--use-one-sent-docs": "ICT's data", "--query-in-block-prob": "ICT's data",
        "--retriever-report-topk-accuracies": "retrieval metrics", "--retriever-score-scaling": "retrieval scores",
        "--indexer-batch-size": "the retrieval indexer", "--indexer-log-interval": "the retrieval indexer",
        "--classes-fraction": "vision classification", "--head-lr-mult": "vision fine-tuning's learning rate",
        "--iter-per-epoch": "vision training", "--mask-factor": "vision masking", "--mask-type": "vision masking",
        "--swin-backbone-type": "the Swin vision backbone", "--vision-backbone-type": "the vision backbone",
        "--dino-bottleneck-size": "DINO's head", "--dino-freeze-last-layer": "DINO's head",
        "--dino-head-hidden-size": "DINO's head", "--dino-local-crops-number": "DINO's data",
        "--dino-local-img-size": "DINO's data", "--dino-norm-last-layer": "DINO's head",
        "--dino-teacher-temp": "DINO's loss", "--dino-warmup-teacher-temp": "DINO's loss",
        "--dino-warmup-teacher-temp-epochs": "DINO's loss", "--onnx-safe": "ONNX export workarounds",
        "--enable-full-sharding-in-hsdp": "Megatron FSDP's HSDP sharding"}.items()},
    "--bert-no-binary-head": "BERT's binary head (megatron/core/models/bert only)",
    "--mask-prob": _BERT, "--short-seq-prob": _BERT,
    "--relative-attention-num-buckets": "T5's relative position buckets (megatron/core/models/T5 only)",
    "--relative-attention-max-distance": "T5's relative position distance (megatron/core/models/T5 only)",
    "--img-h": "image height (the multimodal examples only)", "--img-w": "image width (the multimodal examples only)",
    "--patch-dim": "image patches (the multimodal examples only)",
    "--num-channels": "image channels (the multimodal examples only)",
    "--num-classes": "classification classes (not read by pretrain_gpt.py's model)",
    "--sample-rate": "audio sampling (megatron/core/models/audio only)",
    "--cache-mla-latents": _SERVE, "--decode-only-cuda-graphs": _SERVE, "--enable-chunked-prefill": _SERVE,
    "--max-tokens-to-oom": _SERVE, "--num-speculative-tokens": _SERVE, "--use-legacy-static-engine": _SERVE,
    "--use-same-sampling-seed-across-dp-ranks": _SERVE, "--mamba-inference-conv-states-dtype": _SERVE,
    "--mamba-inference-ssm-states-dtype": _SERVE, "--bert-embedder-type": _SERVE, "--output-bert-embeddings": _SERVE,
    "--mamba-training-ssm-states-dtype": "Mamba layers' states (megatron/core/ssm; a GPT has none)",
    "--apply-wd-to-qk-layernorm": "weight decay (a scalar of the optimizer's update)",
    "--no-weight-decay-cond-type": "weight decay (which parameters it applies to)",
    "--lion-beta1": "the Lion optimizer's hyper-parameter", "--lion-beta2": "the Lion optimizer's hyper-parameter",
    "--yarn-beta-fast": "YaRN's rotary frequencies (computed once)",
    "--yarn-beta-slow": "YaRN's rotary frequencies (computed once)",
    "--yarn-correction-range-round-to-int": "YaRN's rotary frequencies (computed once)",
    "--no-yarn-correction-range-round-to-int": "YaRN's rotary frequencies (computed once)",
    "--yarn-original-max-position-embeddings": "YaRN's rotary frequencies (computed once)",
    "--rotary-seq-len-interpolation-factor": "the rotary frequencies (computed once)",
    "--rope-type": "the rotary frequencies' formula, rope or yarn (computed once; applied alike)",
    "--no-data-sharding": "the data sampler's order (megatron/training/datasets/data_samplers.py)",
    "--dataloader-defer-npy-index-mmap": "data loading (the index files' mmap deferred)",
    "--dataloader-fast-cache-load": "data loading (the dataset caches)",
    "--per-dataset-sequences-path": "data loading (the sequences per dataset)",
    "--phase-transition-iterations": "the data blend's phases (the global batch fixed across them)",
    "--result-rejected-tracker-filename": "logging (the rerun state machine's rejected results)",
    "--run-workload-inspector-server": "profiling on demand (a server beside the trainer)",
    "--langrl-env-config": "the RL environment's file (read with --perform-rl-step)",
    "--refit-method": "RL weight refit (read with --perform-rl-step)",
    **{flag: "multi-latent attention's width, read with --multi-latent-attention; without it no layer reads it"
       for flag in ("--kv-lora-rank", "--q-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim")},
    "--moe-layer-freq": "which layers are MoE, read with --num-experts; without it every layer is dense",
}
NOT_MODELLED = {
    "--freeze-all-layers": "every layer frozen: the step runs forward only, under no_grad (training.py 2353-2354); "
                           "scored as a training step",
    "--perform-rl-step": "the RL training step (rollouts and an inference engine beside the trainer)",
    "--sft": "supervised fine-tuning's data (packed conversations; the tokens a step are scored as --seq-length's)",
    "--dataloader-inter-document-masking": "attention within each document (cu_seqlens): scored as causal attention "
                                           "over the whole sequence",
    "--fake-process-group": "a fake process group: every collective skipped (initialize.py 349), all charged",
    "--output-logit-dtype": "the output layer's logits in another dtype (gpt_model.py): the loss region is charged at "
                            "the output layer's input dtype",
    "--te-precision-config-file": "Transformer Engine's per-module precision overrides",
    "--spec": "a custom layer spec (module and function): scored as the GPT layer the other flags give",
    "--heterogeneous-layers-config-path": "layers of different shapes (heterogeneous config): scored as uniform layers",
    "--heterogeneous-layers-config-encoded-json": "layers of different shapes (heterogeneous config): scored as "
                                                  "uniform layers",
    "--linear-attention-freq": "linear-attention layers among the attention layers: scored as attention",
    "--no-rope-freq": "rotary skipped on some layers: timed as rotary on every layer",
    "--no-persist-layer-norm": "apex's persistent LayerNorm kernel off: the norm timed as the profile's kernel either way",
    "--moe-use-upcycling": "a dense checkpoint converted to MoE before training (training.py 2811)",
    "--moe-upcycling-granularity": "upcycling's expert split (read with --moe-use-upcycling)",
    "--check-for-large-grads": "each gradient bucket checked against its history (param_and_grad_buffer.py 655): a "
                               "pass over the gradients, not timed",
    "--create-all-gather-group": "a separate all-gather process group to overlap it with the reduce-scatter (time)",
    "--ddp-average-in-collective": "the gradient average inside the collective (NCCL's avg), not a division before it",
    "--no-gradient-reduce-div-fusion": "the gradient division as its own kernel, not fused in the reduction",
    "--ddp-pad-buckets-for-high-nccl-busbw": "gradient buckets padded to a multiple of 2^16 elements",
    "--ddp-param-name-patterns-for-fp32-local-accumulation": "fp32 local accumulation of the named parameters' "
                                                             "gradients",
    "--ddp-reduce-scatter-with-fp32-accumulation": "the reduce-scatter as an all-to-all with fp32 accumulation",
    "--disable-symmetric-registration": "NCCL user buffers registered locally, not symmetrically",
    "--gtp-remat-nccl-ub": "weight-remat reduce-scatter buffers registered with NCCL",
    "--gtp-expert-remat-nccl-ub": "the experts' weight-remat reduce-scatter buffers registered with NCCL",
    "--gtp-remat-reduce-scatter-with-fp32-accumulation": "weight remat's reduce-scatter with fp32 accumulation",
    "--fp4-param-gather": "weights kept and all-gathered in FP4",
    "--reuse-grad-buf-for-mxfp8-param-ag": "the gradient buffer reused for MXFP8 weights' all-gather",
    "--keep-fp8-transpose-cache": "Megatron FSDP keeps FP8 weights' transposes",
    "--fsdp-db-use-persist-buf-on-alloc-fail": "Megatron FSDP's double buffer: modules outside the pool persisted",
    "--megatron-fsdp-max-pool-double-buffer": "Megatron FSDP's double buffer sized for the largest unit",
    "--megatron-fsdp-version": "Megatron FSDP's implementation version",
    "--megatron-fsdp-main-params-dtype": "Megatron FSDP's main weights' dtype (fp32 charged)",
    "--megatron-fsdp-main-grads-dtype": "Megatron FSDP's main gradients' dtype (fp32 charged)",
    "--megatron-fsdp-grad-comm-dtype": "Megatron FSDP's gradient communication dtype",
    "--torch-fsdp2-no-reshard-after-forward": "PyTorch FSDP2's weights kept gathered between forward and backward",
    "--no-use-layer-wise-param-layout": "the LayerWise optimizer's legacy buffer layout",
    "--optimizer-cuda-graph": "the optimizer step captured in a CUDA graph (host time)",
    "--optimizer-offload-fraction": "the share of optimizer state on the host (read with --optimizer-cpu-offload)",
    "--overlap-cpu-optimizer-d2h-h2d": "the host optimizer's copies overlapped (read with --optimizer-cpu-offload)",
    "--use-torch-optimizer-for-cpu-offload": "torch's optimizer on the host (read with --optimizer-cpu-offload)",
    "--no-pin-cpu-grads": "host gradients not pinned (read with --optimizer-cpu-offload)",
    "--no-pin-cpu-params": "host weights not pinned (read with --optimizer-cpu-offload)",
}


def settled_pairs(pairs: list[tuple[str, list[str]]], where: str) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """The pairs with a hybrid model and Megatron-LM's retired flags refused, and the flags each encoder form or
    the legacy rotary flag stands for added beside it; returns (the pairs, a note per value overridden)."""
    check_hybrid(pairs, where)
    given = {flag for flag, values in pairs if values != ["false"]}
    for flag, instead in RETIRED.items():
        if flag in given and not (flag == "--checkpoint-activations" and given & set(MEGATRON_DEEPSPEED)):
            raise UserError(f"{where} gives {flag}, which Megatron-LM no longer takes (it stops at its argument "
                            f"checks, arguments.py 591-605 at d98e8a64); give {instead}")
    out, notes = [], []
    rotary = ROTARY in given and "--deepspeed" not in given  # Megatron-DeepSpeed's reader translates it itself
    for flag, values in pairs:
        if rotary and flag == "--position-embedding-type" and values != ["rope"]:
            notes.append(f"--position-embedding-type {' '.join(values)}: read as rope, as Megatron-LM sets it under "
                         f"{ROTARY} (arguments.py 1625-1627 at d98e8a64)")
            values = ["rope"]
        elif flag in ALIASES and values != ["false"]:
            if ALIASES[flag] in given:
                raise UserError(f"{where} gives both {flag} and {ALIASES[flag]}, which Megatron-LM refuses (an assert "
                                "in arguments.py's validate_args at d98e8a64); give one")
            if len(values) != 1:  # checked here, so that the error names the flag the file gives
                raise UserError(f"{flag} takes one value and was given {len(values)} ({' '.join(values) or 'none'}); "
                                "give one")
            positive(flag, cast_value(flag, values[0], int))
            out.append((ALIASES[flag], values))  # the flag itself stays, listed as read (MODELLED)
        out.append((flag, values))
    if rotary and "--position-embedding-type" not in given:
        out.append(("--position-embedding-type", ["rope"]))
    return out, notes



def sgd_momentum(given: dict[str, list[str]], job) -> None:
    """Lists --sgd-momentum where it is not what MODELLED says, and takes it from `given`: read by SGD only
    (megatron/core/optimizer/__init__.py 622-627 at d98e8a64), and at 0 FusedSGD keeps no momentum buffer while
    ckplan's SGD charges one a parameter."""
    values = given.get("--sgd-momentum")
    if values is None or values == ["false"]:
        return
    if job.optimizer != "sgd":
        job.said("--sgd-momentum", " ".join(given.pop("--sgd-momentum")), "no effect",
                 f"SGD's momentum, read by SGD only: the run steps {job.optimizer}")
    elif len(values) == 1 and _zero(values[0]):
        job.said("--sgd-momentum", given.pop("--sgd-momentum")[0], "not modelled",
                 "SGD without momentum: FusedSGD keeps no momentum buffer at 0, ckplan's SGD charges one a "
                 "parameter (over, never under)")


def _zero(text: str) -> bool:
    try:
        return float(text) == 0.0
    except ValueError:
        return False
