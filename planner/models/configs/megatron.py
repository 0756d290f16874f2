"""Megatron-LM's arguments (a launch script of flags, or a YAML mapping of flags to values) as
a Job. The flags are the inverse of planner/emit/megatron.py's export and are read as
megatron/training/arguments.py (NVIDIA/Megatron-LM d98e8a64ddf3, 2026-08-22) defines them:
--ffn-hidden-size defaults to 4 x --hidden-size (with --swiglu int(8h / 3 / 64) x 64), --num-query-groups to the heads,
--kv-channels to hidden / heads, the vocabulary is padded to a multiple of
--make-vocab-size-divisible-by (128) x TP; --recompute-activations is selective recompute of
core_attn; --recompute-method block recomputes the first N decoder layers of every (virtual)
stage, uniform every layer in groups of N (megatron/core/transformer/transformer_block.py)."""

from __future__ import annotations

import math
from pathlib import Path

from planner.errors import UserError
from planner.models.archs import Arch
from planner.models.configs import Job, Recompute, megatron_env, megatron_gptoss, pending
from planner.models.configs.megatron_args import Flags, check_positions, positive, unread_positions
from planner.models.configs.megatron_checks import read_test_mode
from planner.models.configs.megatron_ddp import read_data_parallel
from planner.models.configs.megatron_deepspeed import megatron_lm_flags, read_deepspeed
from planner.models.configs.megatron_files import (
    check_trainer,
    script_pairs,
    text_of,
    torchrun_world,
    yaml_pairs,
)
from planner.models.configs.megatron_flags import (
    DEFAULT_RECOMPUTE_MODULES,
    EAGER_BACKENDS,
    GPT2_VOCAB,
    MODELLED,
    NEGATED,
    NO_EFFECT,
    NO_EFFECT_FAMILIES,
    NO_EFFECT_PREFIXES,
    NOT_MODELLED,
    NOT_MODELLED_FAMILIES,
    PENDING_DEFAULTS,
    PENDING_FLAGS,
    TOKENIZER_SOURCE,
    TOKENIZER_VOCAB,
    read_normalization,
)
from planner.models.configs.megatron_float8 import read_float8
from planner.models.configs.megatron_legacy import settled_pairs, sgd_momentum
from planner.models.configs.megatron_memflags import read_memory_settings
from planner.models.configs.megatron_moe_dispatch import read as read_dispatcher
from planner.models.configs.megatron_offload import read_cpu_offloading
from planner.models.configs.megatron_router import router_facts
from planner.models.configs.megatron_split import layout_counts, stage_layers
from planner.models.configs.megatron_windows import layer_windows
from planner.models.configs.ub_cfg import read_tp_overlap


def read(path: Path) -> Job:
    """The Job a Megatron-LM launch script or YAML of arguments describes."""
    from planner.models.configs.bashargs import read_script

    text = text_of(path)
    where = str(path)
    extras, files, launch = [], {}, {}
    if path.suffix in (".yaml", ".yml"):
        import yaml

        pairs, world, notes = yaml_pairs(text, where), None, []
        data = yaml.safe_load(text)  # valid: yaml_pairs parsed it
        extras, launch = megatron_env.yaml_extras(data), megatron_env.launch_settings(data)  # ENV_VARS
    else:
        script = read_script(text, where)
        check_trainer(script.trainer, where)
        pairs, world, notes = script_pairs(script.args, where), torchrun_world(script.launcher_args), script.notes
        files, (extras, launch) = script.files, megatron_env.script_env(script.exports)  # its `export NAME=value` lines
    job = from_pairs(pairs, where, files)
    for key, value in launch.items():
        setattr(job.modelled, key, value)
    if "runtime_version" in launch:  # a Megatron-Bridge run's record (megatron_env.launch_settings)
        job.notes = [megatron_env.BRIDGE_VERSION_NOTE if n.startswith("runtime version:") else n for n in job.notes]
    for name, value, status, what in extras:
        job.said(name, value, status, what)
    job.world_size = world
    job.notes[:0] = notes
    return job


def from_pairs(pairs: list[tuple[str, list[str]]], where: str, files: dict[str, str] | None = None) -> Job:
    """The job the flags describe; `files`: what the script writes in here-documents (a ds_config), by path."""
    pairs, translated = settled_pairs(pairs, where)  # a hybrid model and retired flags refused, aliases read
    sink: list = []
    if any(flag == "--deepspeed" for flag, _ in pairs):  # Megatron-DeepSpeed's own model flags
        pairs, more = megatron_lm_flags(pairs)
        translated += more
    flags = Flags(pairs, sink)
    arch, seq_len, vocab = _arch(flags, where)
    backend = flags.take("--attention-backend", "attention kernel (unfused, local: the s x s scores kept)", str, "auto")
    # --transformer-impl local builds get_gpt_layer_local_spec, whose core attention is LocalSpecProvider's
    # DotProductAttention (gpt_builders.py 109-147, megatron/core/models/backends.py 129-131 at d98e8a64): the
    # s x s scores kept whatever --attention-backend says (the flag itself taken and listed in _settings)
    local = flags.given.get("--transformer-impl") == ["local"]
    mbs = positive("--micro-batch-size", flags.take("--micro-batch-size", "sequences per microbatch", int, 1))
    job = Job(framework="megatron", source=where, arch=arch, seq_len=seq_len, micro_batch_size=mbs, vocab_unpadded=vocab,
              attention="eager" if backend in EAGER_BACKENDS or local else "flash")
    job.global_batch_size = positive("--global-batch-size", flags.take("--global-batch-size", "sequences per iteration", int))
    _parallel(flags, job)
    _recompute(flags, job)
    read_cpu_offloading(flags, job)  # after the pipeline and recompute it refuses
    _precision(flags, job)
    if flags.has("--deepspeed"):  # Megatron-DeepSpeed's engine: its ds_config read (megatron_deepspeed.py)
        read_deepspeed(flags, job, files or {}, where)
    flags.take("--deepspeed", "DeepSpeed's engine", bool)  # given false: off
    read_tp_overlap(flags, job, where=where, files=files)  # --tp-comm-overlap and its cfg file (ub_cfg.py)
    _settings(flags, job)
    for flag, value, status, what in sink:
        job.said(flag, value, status, what)
    job.notes += flags.notes + translated
    if job.runtime is None:
        job.notes.append("runtime version: Megatron-LM d98e8a64 (2026-08-22), the one record read "
                         "(planner/cost/runtimes.py); the flags are read as that version takes them")
    _rest(flags, job)
    return job


def _arch(flags: Flags, where: str) -> tuple[Arch, int, int]:
    def need(flag: str, what: str) -> int:
        value = flags.take(flag, what, int)
        if value is None:
            raise UserError(f"{where} does not give {flag}, which the model's size needs; add it to its arguments")
        return positive(flag, value)

    layers, hidden = need("--num-layers", "decoder layers"), need("--hidden-size", "hidden size")
    heads, seq_len = need("--num-attention-heads", "attention heads"), need("--seq-length", "tokens per sequence")
    check_positions(flags, seq_len)
    # the default width: 4 x hidden, or with --swiglu two thirds of it rounded down to a multiple of 64
    # (arguments.py 1320-1329 at d98e8a64); --moe-ffn-hidden-size defaults to it (1650-1651)
    default_ffn = int((4 * hidden * 2 / 3) / 64) * 64 if flags.has("--swiglu") else 4 * hidden
    ffn = positive("--ffn-hidden-size", flags.take("--ffn-hidden-size", "MLP width", int, default_ffn))
    gqa = flags.take("--group-query-attention", "grouped-query attention", bool, False)
    groups = flags.take("--num-query-groups", "key/value heads (with --group-query-attention)", int, heads)
    kv = groups if gqa else heads
    head_dim = flags.take("--kv-channels", "head width", int)
    vocab = flags.take("--vocab-size", "the tokenizer's vocabulary", int)
    tokenizer = flags.given.get("--tokenizer-type", [""])[0]
    if vocab is None and tokenizer in TOKENIZER_VOCAB:
        vocab = TOKENIZER_VOCAB[tokenizer]
        flags.notes.append(f"no --vocab-size: --tokenizer-type {tokenizer}'s {vocab} tokens ({TOKENIZER_SOURCE})")
    if vocab is None and flags.has("--merge-file"):
        vocab = GPT2_VOCAB  # a --vocab-file with --merge-file is GPT-2's BPE
        flags.notes.append(f"no --vocab-size: the --vocab-file and --merge-file of GPT-2's BPE, {GPT2_VOCAB} tokens "
                           "(the files themselves are not read)")
    if vocab is None:
        raise UserError(f"{where} does not give --vocab-size (Megatron-LM takes it from the tokenizer, which ckplan "
                        "does not read); add --vocab-size N to its arguments (ckplan itself takes no --vocab-size)")
    divisor = positive("--make-vocab-size-divisible-by", flags.take("--make-vocab-size-divisible-by",
                                                                     "vocabulary padding", int, 128))
    tp = flags.given.get("--tensor-model-parallel-size", ["1"])  # taken (and checked) with the other degrees
    multiple = divisor * (max(int(tp[0]), 1) if tp and tp[0].isdigit() else 1)
    padded = math.ceil(vocab / multiple) * multiple  # megatron/training/tokenizer: _vocab_size_with_padding
    if padded != vocab:
        flags.notes.append(f"vocabulary {vocab} padded to {padded}, a multiple of --make-vocab-size-divisible-by "
                           f"{divisor} x TP, as Megatron-LM pads it")
    swiglu = flags.take("--swiglu", "SwiGLU MLP", bool, False)
    # --quick-geglu is gated as --swiglu is (gated_linear_unit=True: fc1 twice --ffn-hidden-size wide),
    # with quick_gelu for SiLU (megatron/training/argument_utils.py 314-326 at d98e8a64); the default
    # width stays 4 x hidden, which arguments.py narrows for --swiglu only
    quick_geglu = flags.take("--quick-geglu", "a quick-GeGLU MLP (gated, as SwiGLU)", bool, False)
    if swiglu and quick_geglu:
        raise UserError(f"{where} gives both --swiglu and --quick-geglu, which Megatron-LM refuses (an assert in "
                        "argument_utils.py); give one")
    if quick_geglu:
        flags.notes.append("--quick-geglu: a gated MLP of SwiGLU's weights, FLOPs and kept tensors; its quick-GeLU "
                           "timed as SwiGLU's fused kernel")
    megatron_gptoss.glu_offset(flags, quick_geglu=quick_geglu)
    swiglu = swiglu or quick_geglu
    read_normalization(flags, gated=swiglu)  # the norm the block's style builds; the other kind not modelled
    untied = flags.take("--untie-embeddings-and-output-weights", "separate output weights", bool, False)
    no_bias = flags.take("--disable-bias-linear", "no linear biases", bool, False)
    qkv_bias = flags.take("--add-qkv-bias", "q/k/v biases", bool, False)
    qk_norm = flags.take("--qk-layernorm", "q/k norms", bool, False)
    style = "llama" if swiglu else "gpt"
    kind = (flags.given.get("--position-embedding-type", ["learned_absolute"]) or [""])[-1]
    positions = _learned_positions(flags, seq_len) if style == "gpt" else unread_positions(flags, kind, hidden)
    # dropout probabilities: Megatron-LM's defaults 0.1 both (arguments.py); --hidden-dropout is the
    # residual dropouts' and the embedding's (LanguageModelEmbedding's embedding_dropout)
    hidden_dropout = flags.take("--hidden-dropout", "the residual and embedding dropouts' probability (0: no mask "
                                "kept)", float, 0.1)
    attention_dropout = flags.take("--attention-dropout", "the attention probabilities' dropout (a mask of the scores "
                                   "under unfused attention only; fused kernels drop inside)", float, 0.1)
    for flag, value in (("--hidden-dropout", hidden_dropout), ("--attention-dropout", attention_dropout)):
        if not 0 <= value < 1:
            raise UserError(f"{flag} {value!r} is not a probability from 0 up to 1; give one")
    moe = _moe(flags, layers, ffn)
    experts, biased = megatron_gptoss.expert_facts(flags, moe=bool(moe), no_bias=no_bias)  # GPT-OSS's, if any
    if swiglu and biased:
        flags.notes.append("linear biases (Megatron-LM's default without --disable-bias-linear) are not modelled "
                           "on a SwiGLU model's dense linears: a hidden-size vector per linear, kilobytes; a MoE "
                           "block's experts' are (te_moe_eager.py)")
    if moe and style == "gpt":  # formulas.py and analytic_kept.py build a GPT-style block's MLP dense
        raise UserError(f"{where}: --num-experts without --swiglu is a mixture of GeLU experts, which ckplan does not "
                        "model (its GPT-style block has one dense MLP: the experts' weights, FLOPs and kept bytes "
                        "would be wrong); ckplan scores mixtures of SwiGLU experts")
    mla = _mla(flags)
    moe.update(experts, **megatron_gptoss.yarn_scaling(flags, kind, mla=bool(mla)),  # the Arch's GPT-OSS fields
               **megatron_gptoss.sink_fields(flags), **router_facts(flags, moe=bool(moe)))
    windows = layer_windows(flags, layers)  # --window-size, --window-attn-skip-freq (megatron_windows.py)
    try:
        arch = Arch(name=Path(where).stem, hidden_size=hidden, intermediate_size=ffn, num_layers=layers,
                    num_heads=heads, num_kv_heads=kv, vocab_size=padded, tie_word_embeddings=not untied, style=style,
                    max_position_embeddings=positions,
                    # a GPT-style MLP's GELU is one kernel (megatron/core/fusions/fused_bias_gelu.py, or F.gelu)
                    mlp_act="gelu_kernel" if style == "gpt" else "gelu",
                    qkv_bias=qkv_bias, head_dim=head_dim, qk_norm=qk_norm,
                    # a GPT-style block's positions: rotary (rope, yarn), a table, or none
                    rotary=kind in ("rope", "yarn", "mrope") if style == "gpt" else None,
                    residual_dropout=hidden_dropout > 0, embedding_dropout=hidden_dropout > 0,
                    attention_dropout=attention_dropout > 0,
                    layer_windows=windows, source=f"{where} (Megatron-LM arguments)", **moe, **mla)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where}: the model flags do not describe a model ({exc})") from None
    if heads % kv:
        raise UserError(f"--num-query-groups {kv} does not divide --num-attention-heads {heads}; give a divisor")
    return arch, seq_len, vocab  # the vocabulary before Megatron-LM's padding too


def _learned_positions(flags: Flags, seq_len: int) -> int | None:
    """The learned position table's rows of a GPT-style model (--position-embedding-type learned_absolute, Megatron-LM's
    default: arguments.py 2115 at 6e091e1b): --max-position-embeddings; None for rope, none or --no-position-embedding."""
    kind = flags.take("--position-embedding-type", "position embedding (learned_absolute: a table of parameters "
                      "on the first stage; rope, none: no parameters)", str, "learned_absolute")
    if flags.take("--no-position-embedding", "no position embedding", bool, False) or kind != "learned_absolute":
        return None
    rows = flags.take("--max-position-embeddings", "the learned position table's rows", int)
    if rows is None:
        flags.notes.append(f"no --max-position-embeddings (Megatron-LM requires it): the learned position table "
                           f"taken as --seq-length's {seq_len} rows")
        return seq_len
    return positive("--max-position-embeddings", rows)


def _moe(flags: Flags, layers: int, ffn: int) -> dict:
    experts = flags.take("--num-experts", "routed experts", int)
    if not experts:
        return {}
    topk = flags.take("--moe-router-topk", "experts per token", int, 2)
    width = flags.take("--moe-ffn-hidden-size", "expert MLP width", int, ffn)
    shared = flags.take("--moe-shared-expert-intermediate-size", "shared experts' width", int, 0)
    gate = flags.take("--moe-shared-expert-gate", "shared expert gate", bool, False)
    freq = flags.take("--moe-layer-freq", "which layers are MoE", str, "1")
    dense = _dense_layers(freq, layers)
    return dict(num_experts=experts, num_experts_per_tok=topk, moe_intermediate_size=width,
                num_shared_experts=1 if shared else 0, shared_intermediate_size=shared, shared_expert_gate=gate,
                dense_layers=dense)


def _dense_layers(freq: str, layers: int) -> tuple[int, ...]:
    """--moe-layer-freq: N (every Nth layer MoE) or a list expression like ([0]*3+[1]*58), read
    without running it: runs of [v]*n joined by +."""
    import re

    text = freq.strip().strip("\"'")
    if text.isdigit():
        every = int(text)
        return tuple(i for i in range(layers) if i % every) if every > 1 else ()
    pattern: list[int] = []
    for part in re.findall(r"\[([0-9, ]*)\](?:\s*\*\s*(\d+))?", text):
        values = [int(v) for v in part[0].split(",") if v.strip()]
        pattern += values * int(part[1] or 1)
    if len(pattern) != layers or not re.fullmatch(r"[\[\]0-9,*+() ]+", text):
        raise UserError(f"--moe-layer-freq {freq!r}: give N or a list expression of {layers} zeros and ones, e.g. "
                        "([0]*3+[1]*58)")
    return tuple(i for i, v in enumerate(pattern) if not v)


def _mla(flags: Flags) -> dict:
    if not flags.take("--multi-latent-attention", "multi-head latent attention", bool, False):
        return {}
    return dict(kv_lora_rank=flags.take("--kv-lora-rank", "latent K/V rank", int, 512),
                q_lora_rank=flags.take("--q-lora-rank", "latent Q rank", int, 0) or 0,
                qk_nope_head_dim=flags.take("--qk-head-dim", "q/k head width", int, 128),
                qk_rope_head_dim=flags.take("--qk-pos-emb-head-dim", "rotary head width", int, 64),
                v_head_dim=flags.take("--v-head-dim", "v head width", int, 128))


def _context_parallel(flags: Flags, job: Job) -> None:
    """--context-parallel-size (megatron/core/model_parallel_config.py 100) and --cp-comm-type
    (megatron/training/arguments.py 3221-3226: one type, or one per layer; default p2p), both at d98e8a64: p2p and allgather are modelled (planner/cost/contextparallel.py),
    a2a (planner/cost/contextparallel.py) are modelled; a2a+p2p and a type per layer are scored as p2p and said."""
    job.cp = positive("--context-parallel-size",
                       flags.take("--context-parallel-size", "context parallelism (each rank seq / cp tokens, TE's "
                                                             "ring attention)", int, 1))
    kinds = flags.given.get("--cp-comm-type")
    if kinds is None:
        return
    if len(set(kinds)) == 1 and kinds[0] in ("p2p", "allgather", "a2a"):
        flags.take_list("--cp-comm-type", "context parallelism's K/V exchange")
        job.modelled.cp_comm = kinds[0]


def _parallel(flags: Flags, job: Job) -> None:
    _context_parallel(flags, job)
    job.tp = positive("--tensor-model-parallel-size",
                       flags.take("--tensor-model-parallel-size", "tensor parallelism", int, 1))
    job.sp = flags.take("--sequence-parallel", "sequence parallelism", bool, False) and job.tp > 1
    job.pp = positive("--pipeline-model-parallel-size",
                       flags.take("--pipeline-model-parallel-size", "pipeline stages", int, 1))
    per_virtual = flags.take("--num-layers-per-virtual-pipeline-stage", "virtual stages (layers each)", int)
    virtual = flags.take("--num-virtual-stages-per-pipeline-rank", "virtual stages per rank", int)
    layers = job.arch.num_layers
    if per_virtual:
        if layers % (per_virtual * job.pp):
            raise UserError(f"--num-layers-per-virtual-pipeline-stage {per_virtual} x --pipeline-model-parallel-size "
                            f"{job.pp} does not divide --num-layers {layers}; give a divisor")
        job.chunks = layers // (per_virtual * job.pp)
    elif virtual:
        job.chunks = virtual
    job.mtp_layers = flags.take("--mtp-num-layers", "multi-token-prediction layers on the last stage (each an "
                                "embedding lookup, eh_proj, a transformer layer, the shared head and its own loss: "
                                "planner/profiler/analytic_mtp.py)", int, 0) or 0
    if job.mtp_layers < 0:
        raise UserError(f"--mtp-num-layers {job.mtp_layers}: give 0 or more multi-token-prediction layers")
    layout = flags.given.get("--pipeline-model-parallel-layout")
    if layout:  # arguments.py 941-951 at d98e8a64: the layout's stage count / PP is the virtual pipeline size
        stages = len(layout_counts(layout[0]))
        if stages % job.pp:
            raise UserError(f"--pipeline-model-parallel-layout lists {stages} stages, not a multiple of "
                            f"--pipeline-model-parallel-size {job.pp}; Megatron-LM refuses it")
        job.chunks = stages // job.pp
    if job.chunks > 1:
        job.schedule = "interleaved-1F1B"
    job.layers_per_stage = stage_layers(flags, job)
    job.ep = positive("--expert-model-parallel-size",
                       flags.take("--expert-model-parallel-size", "expert parallelism", int, 1))
    read_data_parallel(flags, job)
    read_dispatcher(flags, job)
    if flags.has("--expert-tensor-parallel-size") and flags.given["--expert-tensor-parallel-size"] == [str(job.tp)]:
        job.modelled.expert_tp = flags.take("--expert-tensor-parallel-size", "experts split over the TP group "
                                            "(megatron-core's default)", int)


def _recompute(flags: Flags, job: Job) -> None:
    granularity = flags.take("--recompute-granularity", "recompute: full layers or selected modules", str)
    method_given, num_given = flags.has("--recompute-method"), flags.has("--recompute-num-layers")
    method = flags.take("--recompute-method", "which layers recompute in full", str)
    num = positive("--recompute-num-layers",  # "between 1 and num_layers_per_pipeline_rank" (transformer_config.py)
                   flags.take("--recompute-num-layers", "layers recomputed (block) or per group (uniform)", int, 1))
    modules = flags.take_list("--recompute-modules", "modules recomputed in every decoder layer")
    if flags.take("--recompute-activations", "selective recompute of core attention", bool, False):
        granularity = granularity or "selective"
    if granularity == "full":
        if method == "block":
            job.recompute = Recompute(mode="block", num_layers=num)
        elif method == "uniform":
            job.recompute = Recompute(mode="full")
            if num > 1 and job.mtp_layers:  # multi_token_prediction.py 1621-1627 at d98e8a64
                raise UserError(f"--recompute-method uniform --recompute-num-layers {num} with --mtp-num-layers: "
                                "Megatron-core asserts recompute_num_layers 1 for MTP recompute; give 1")
            if num > 1:
                job.notes.append(f"--recompute-method uniform --recompute-num-layers {num}: every layer recomputes, "
                                 f"scored as each layer checkpointed alone (Megatron keeps one input per {num} "
                                 "layers: fewer bytes than scored)")
        else:
            raise UserError("--recompute-granularity full needs --recompute-method block or uniform; add one")
    elif granularity == "selective":
        from planner.models.configs.megatron_flags import (
            check_recompute_modules,
            recompute_modules_option,
        )

        if method_given or num_given:  # Megatron-LM d98e8a64 arguments.py 1425-1428, transformer_config.py 1926-1932
            flag = "--recompute-method" if method_given else "--recompute-num-layers"
            raise UserError(f"{flag} with --recompute-granularity selective: Megatron-LM refuses it (selective "
                            "recomputes its modules in every layer); drop it, or use --recompute-granularity full")
        modules = tuple(modules or DEFAULT_RECOMPUTE_MODULES)
        check_recompute_modules(modules)
        job.recompute = Recompute(mode="selective", option=recompute_modules_option(modules, job.arch.num_experts > 0),
                                  modules=modules)
    elif granularity is not None:
        raise UserError(f"--recompute-granularity {granularity!r}: give full or selective")


FP32_RUN = ("without --bf16 or --fp16 Megatron-LM trains in fp32: its weights, gradients and Adam state are scored "
            "in fp32, but its activations and matmuls as bf16 (the profile's 16-bit tensor-core rates and 2-byte kept "
            "tensors); add --bf16 to score a bf16 run")


def _precision(flags: Flags, job: Job) -> None:
    fp16 = flags.take("--fp16", "fp16-mixed: fp16 weights and gradient buffers, a loss scaler", bool, False)
    given = "--bf16" in flags.given
    bf16 = flags.take("--bf16", "bf16 weights and activations, fp32 master weights and Adam state", bool, False)
    if bf16 and fp16:  # arguments.py: assert not (args.fp16 and args.bf16)
        raise UserError(f"{job.source}: --bf16 and --fp16 are both given; Megatron-LM trains in one: give one")
    job.precision = "bf16-mixed" if bf16 else "fp16-mixed" if fp16 else "fp32"
    if job.precision == "fp32":  # params_dtype torch.float without either (arguments.py 1194-1206 at d98e8a64)
        # in place of take's "(off)" entry where --bf16 false was given, else a new one
        flags.sink[len(flags.sink) - given:] = [("--bf16", "false" if given else "not given", "not modelled", FP32_RUN)]
    name = flags.take("--optimizer", "optimizer", str, "adam")
    if name not in ("adam", "sgd"):
        raise UserError(f"--optimizer {name!r}: ckplan scores adam and sgd; give one of them")
    job.optimizer = name
    sgd_momentum(flags.given, job)


def _settings(flags: Flags, job: Job) -> None:
    """bf16 moments and the rest (Job.modelled); arguments.py at d98e8a64ddf3: --exp-avg-dtype and
    --exp-avg-sq-dtype (3675-3684, default fp32) take effect with --use-precision-aware-optimizer."""
    impl = flags.take("--transformer-impl", "Transformer Engine's layers (the record's te_cublas_workspace, held after "
                      "the step; the same tensors kept as the local layers)", str, "transformer_engine")
    if impl == "local":  # the record's local_spec_buffer (TrainingSetup.local_layers)
        if job.cp > 1:  # DotProductAttention asserts it (dot_product_attention.py 57-58 at d98e8a64)
            raise UserError(f"--transformer-impl local with --context-parallel-size {job.cp}: the local spec's "
                            "DotProductAttention runs context parallelism 1 only (Megatron-LM asserts it); drop one")
        job.modelled.local_layers = True
        flags.sink[-1] = (*flags.sink[-1][:2], "modelled", "Megatron-core's local spec, in memory: DotProductAttention "
                          "keeps the s x s scores and its global buffer for baddbmm's input, no Transformer Engine "
                          "workspace (the record's local_spec_buffer); in time not: its layers are timed as "
                          "Transformer Engine's fused kernels")
    elif impl != "transformer_engine":
        flags.sink[-1] = (*flags.sink[-1][:2], "not modelled", f"--transformer-impl {impl}: ckplan reads "
                          "transformer_engine and local")
    read_float8(flags, job)
    # --grad-reduce-in-bf16, --fp8-param-gather, the fused cross-entropies, TE's grouped GEMM
    read_memory_settings(flags, job, te_layers=impl == "transformer_engine")
    # bf16 with fp32 main grads sets it (arguments.py 1213-1217 at d98e8a64ddf3): the record's fp32 main_grad
    flags.take("--accumulate-allreduce-grads-in-fp32", "gradients accumulated and reduced in fp32 (the runtime "
               "record's 4-byte main_grad)", bool)
    # on by default (arguments.py 2519-2521 at 6e091e1b); its --no- form is listed (megatron_flags.NOT_MODELLED)
    flags.take("--check-for-nan-in-loss-and-grad", "the NaN check of every gradient bucket before its reduction "
               "(timed: the runtime record's step_whole_bytes)", bool)
    _test_settings(flags, job)
    moments = ("--exp-avg-dtype", "--exp-avg-sq-dtype")
    if flags.has("--use-precision-aware-optimizer") and all(flags.given.get(f) == ["bf16"] for f in moments):
        for flag in moments:
            flags.take(flag, "Adam's moment in bf16 (optimizer_state_dtype bf16: 2 B where fp32 is 4)")
        job.modelled.optimizer_state_dtype = "bf16"


def _test_settings(flags: Flags, job: Job) -> None:
    """Megatron-LM's functional tests' settings that cost bytes or time, each a flag of arguments.py (6e091e1b)."""
    modelled = job.modelled
    modelled.unfused_grad_accumulation = bool(flags.take(
        "--no-gradient-accumulation-fusion", "each weight gradient written in bf16 and added into the fp32 main_grad "
        "by the DDP hook: 4 B more a weight a microbatch (--no-gradient-accumulation-fusion)", bool, False))
    modelled.log_params_norm = bool(flags.take(
        "--log-params-norm", "the parameters' norm over the rank's fp32 shard every iteration: 4 B a parameter of the "
        "shard a step (--log-params-norm)", bool, False))
    read_test_mode(flags, modelled)
    modelled.log_num_zeros_in_grad = bool(flags.take(
        "--log-num-zeros-in-grad", "the gradients' zeros counted over the rank's fp32 shard every step: 4 B a "
        "parameter of the shard (--log-num-zeros-in-grad)", bool, False))
    modelled.timing_log_level = int(flags.take("--timing-log-level", "Megatron-LM's timers above level 0 synchronize the device at each start and stop (megatron/core/timers.py 130-155 at 2795ebde): charged at the regions the code times (planner/cost/hosttime.py timer_sync_ms)", int, 0))
    if modelled.timing_log_level not in (0, 1, 2):
        raise UserError(f"--timing-log-level is {modelled.timing_log_level}; Megatron-LM takes 0, 1 or 2")
    modelled.deterministic = bool(flags.take(
        "--deterministic-mode", "torch's deterministic algorithms (arguments.py 1528-1537): each of Transformer "
        "Engine's GEMM, norm and attention outputs filled with NaN before it is written (--deterministic-mode); "
        "TE's attention under determinism: cuDNN's deterministic backward on sm90, and on sm100+ without attention "
        "dropout (dot_product_attention/utils.py 1293-1356, fused_attn_f16_arbitrary_seqlen.cu 824-826, TE v2.16.0), "
        "at cuDNN's published deterministic rate where there is one (GB200), else timed as the non-deterministic "
        "kernel; FlashAttention-2 below sm90 (A100) and on sm100+ under attention dropout (fused_attn.cpp 461-470, "
        "TE v2.18.0): its forward at the GPU's FlashAttention-2 rate, its deterministic backward by its split "
        "grid's waves", bool, False))
    if modelled.deterministic:
        flags.notes.append("--deterministic-mode: torch's NaN fill of Transformer Engine's outputs is charged; "
                           "TE's deterministic attention as it picks it: cuDNN's deterministic backward at its "
                           "published rate on GB200 without attention dropout (none published for H100: timed there "
                           "as the non-deterministic kernel); FlashAttention-2 on A100, and on B200 / GB200 under "
                           "attention dropout (cuDNN's deterministic backward takes none on sm100+), its forward at "
                           "the GPU's FlashAttention-2 rate and its backward as its split grid runs in waves of one "
                           "block an SM (jobsettings.flash2_deterministic_factor); the dropout's own cost in the "
                           "kernel is not charged")


def _rest(flags: Flags, job: Job) -> None:
    """Every flag not read above: pending settings, not modelled, no effect, or unknown."""
    for flag, values in flags.given.items():
        value = " ".join(values)
        if flag in PENDING_FLAGS:
            if values == ["false"] or PENDING_DEFAULTS.get(flag) == value:
                job.said(flag, value, "modelled", "at its default: nothing to add")
            else:
                job.said(flag, value, "not modelled", pending(PENDING_FLAGS[flag]))
        elif flag in NEGATED and values == ["false"]:
            job.said(flag, value, "not modelled", NOT_MODELLED[NEGATED[flag]])
        elif flag in MODELLED or flag in NOT_MODELLED:  # a store_true flag given false is off
            what, off = MODELLED.get(flag) or NOT_MODELLED[flag], values == ["false"]
            job.said(flag, value, "no effect" if off else "modelled" if flag in MODELLED else "not modelled",
                     f"given false, so off (on: {what})" if off else what)
        elif flag in NO_EFFECT:
            job.said(flag, value, "no effect", NO_EFFECT[flag])
        elif flag.startswith(tuple(NOT_MODELLED_FAMILIES)):
            family = next(prefix for prefix in NOT_MODELLED_FAMILIES if flag.startswith(prefix))
            job.said(flag, value, "not modelled", NOT_MODELLED_FAMILIES[family])
        elif flag.startswith(tuple(NO_EFFECT_FAMILIES)):
            family = next(prefix for prefix in NO_EFFECT_FAMILIES if flag.startswith(prefix))
            job.said(flag, value, "no effect", NO_EFFECT_FAMILIES[family])
        elif flag.startswith(NO_EFFECT_PREFIXES):
            job.said(flag, value, "no effect", "logging, checkpoint, evaluation, data or schedule of the learning rate")
        else:
            job.said(flag, value, "unknown", "not a flag this reader knows: if it changes memory or time, the "
                                             "prediction leaves it out")
