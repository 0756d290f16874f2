"""A plan as Megatron-LM arguments: the stage split as `--pipeline-model-parallel-layout`
(virtual stages too) and recomputation as `--recompute-method block --recompute-num-layers N`
or, where the plan recomputes parts of layers, `--recompute-granularity selective
--recompute-modules ...` when that is the faster of the two that fits.

Facts from megatron-core 0.16 (transformer/pipeline_parallel_layer_layout.py): the layout
is stages separated by `|`, `E` the embedding, `t` a decoder layer, `m` an MTP layer, `L`
the loss (final norm + output layer), `x*n` and `(...)*n` repeat; exactly one E, first,
and one L, last. With V virtual stages per rank the layout lists P·V stages, virtual stage v
of rank r at position v·P + r (PipelineParallelLayerLayout.__init__): the pipeline's stages in
order, in loop placement. transformer/transformer_block.py, recompute_method 'block': each
stage (each virtual stage: a TransformerBlock of its own) recomputes its first
recompute_num_layers decoder layers, one N for every stage; the pipeline schedule is 1F1B,
interleaved with virtual stages (pipeline_parallel/schedules.py; no zero-bubble or V-shaped
schedule in megatron-core 0.16). Selective recompute (recompute_granularity 'selective',
recompute_modules) is one module list for every decoder layer, and TransformerConfig refuses
it with a recompute_num_layers: block recompute of whole layers and selective recompute are
one or the other.

Mixtures of experts and latent attention, as megatron-core 0.16's TransformerConfig and
MLATransformerConfig name them (num_moe_experts, moe_router_topk, moe_ffn_hidden_size,
moe_shared_expert_intermediate_size, moe_shared_expert_gate, moe_layer_freq, moe_grouped_gemm,
moe_token_dispatcher_type, moe_expert_capacity_factor, moe_pad_expert_input_to_capacity,
expert_model_parallel_size; multi_latent_attention, q_lora_rank, kv_lora_rank, qk_head_dim,
qk_pos_emb_head_dim, v_head_dim) and Megatron-LM's arguments spell them (--num-experts, ...).
"""

from __future__ import annotations

import math
import re
import shlex
from itertools import combinations

from planner.cost import dataparallel
from planner.emit import dp_support, facts, megatron_rounding, megatron_window, rounding, scored_as
from planner.emit.layer_kinds import megatron_arguments as layer_kind_arguments
from planner.emit.megatron_positions import arguments as position_arguments
from planner.errors import UserError
from planner.models.configs.megatron_flags import RECOMPUTE_MODULES, recompute_modules_option
from planner.schema import Plan, Profile
from planner.units import format_ms

TARGET = "Megatron-LM"
CANNOT_EXPRESS = [
    "a checkpoint count per stage: --recompute-num-layers N recomputes the first N decoder layers of "
    "EVERY stage, so this export takes the largest count of the plan (safe for memory, more recompute).",
    "which layers of a stage are recomputed: always its first N decoder layers.",
    "recomputing the embedding or the loss layer (decoder layers only).",
    "a selective recompute choice per layer: --recompute-modules is one list for every decoder layer, and "
    "not beside block recompute of whole layers; nor save-matmuls (op-level checkpointing), a dense MLP's "
    "activation alone (moe_act is the MoE layers') or attn (the whole attention module; core_attn is the "
    "attention kernel alone, Q, K and V kept: ckplan's core-attn).",
    "activation offload per layer: --cpu-offloading offloads the first N decoder layers of one stage with no "
    "recompute beside them (TransformerConfig; written where the plan is that window), --offload-modules every "
    "layer's module inputs: other offloaded layers are exported as whole-layer recompute.",
    "zero-bubble and V-shaped schedules (ZB, ZBV, DualPipeV): megatron-core 0.16 interleaves virtual stages "
    "in a loop (interleaved 1F1B) only.",
]
# The plan's schedule -> what Megatron-LM runs instead: the same pipeline stages as virtual
# stages of its interleaved 1F1B (ZB keeps its loop placement; a V is re-placed as a loop)
RUNS_AS = {**rounding.ONLY_1F1B, "ZB": "interleaved-1F1B", "ZBV": "interleaved-1F1B",
           "DualPipeV": "interleaved-1F1B"}


def export(plan: Plan, profile: Profile, *, plan_file: str) -> rounding.Export:
    scored_as.refuse_uncompiled_target(plan.setup, TARGET)
    _check_microbatches(plan)
    window = megatron_window.count(plan, profile) is not None  # TE's window: written, not rounded
    roles, exact = rounding.decoder_start(plan, profile, TARGET, runs_as=RUNS_AS, selective=True, keep_offload=window,
                                          round_zero=lambda r: dp_support.round_zero(r, TARGET))
    megatron_rounding.grouped_gemm(exact, profile)
    rounded, num = (exact, 0) if window else _block(exact, roles, profile)
    candidates = [(rounded, ()), *_selective(exact, roles, profile)]
    if len(candidates) > 1:  # the plan recomputes some layers selectively: block or one module list
        block = rounded
        rounded, fits = rounding.scored_choice([candidate for candidate, _ in candidates], profile)
        modules = next(m for candidate, m in candidates if candidate is rounded)
        if modules:
            block_ms = rounding.evaluate(block.ranks(), profile, block.setup).iteration_ms
            instead = f"--recompute-num-layers {num}" if num else "no recompute"
            rounded.changes.append(f"chosen over block recompute ({instead}, {format_ms(block_ms)} per iteration) "
                                   "as the fastest setting that fits" if fits else
                                   "no setting fits; this one comes closest")
    else:
        modules = ()
    scored = rounding.rescore(plan, profile, rounded)
    cannot = CANNOT_EXPRESS + scored_as.megatron_fp8_unwritten(plan.setup.training)
    header = rounding.header_lines(plan_file, TARGET, cannot, rounded, scored, plan_setup=plan.setup)
    text = rounding.comment(header) + "\n" + _arguments(rounded, roles, profile, 0 if modules else num, modules)
    return rounding.Export(TARGET, text, ".megatron.sh", rounded, scored, cannot)


def _check_microbatches(plan: Plan) -> None:
    """Megatron-LM's interleaved schedule runs microbatches in groups of P per virtual stage
    (--microbatch-group-size-per-virtual-stage, default P; pipeline_parallel/schedules.py wants
    the last group empty or at least P): M a multiple of P, at least P."""
    pipeline = plan.setup.pipeline
    if pipeline.chunks > 1 and pipeline.microbatches % pipeline.stages:
        raise UserError(f"Megatron-LM's interleaved schedule runs microbatches in groups of the pipeline size "
                        f"({pipeline.stages}), and this plan has {pipeline.microbatches}; solve with --microbatches "
                        f"a multiple of {pipeline.stages}")


def _block(exact: rounding.Rounded, roles: rounding.Roles, profile: Profile) -> tuple[rounding.Rounded, int]:
    """Block recompute of whole layers: the first N decoder layers of every (virtual) stage,
    N the plan's largest count; with the N."""
    rounded = rounding.Rounded(stages=rounding.whole_layers(exact.stages), setup=exact.setup,
                               changes=list(exact.changes))
    partial = {name: option for s in exact.stages for name, option in s.recompute.items() if option != "full"}
    if partial:
        rounded.changes.append(f"{TARGET} is exported with whole-layer recompute: the {len(partial)} layers the "
                               f"plan recomputes selectively ({', '.join(sorted(set(partial.values())))}) "
                               "recompute whole layers")
    counts, ks = rounding.decoder_counts(rounded.stages, roles)
    num = max(ks)
    rounding.first_k(rounded, roles, [min(num, count) for count in counts])
    if any(k != min(num, count) for k, count in zip(ks, counts)):
        rounded.changes.append(f"one --recompute-num-layers for all stages: {num}, the largest of the plan's "
                               f"per-stage counts {ks}")
    smaller = _smallest_fitting(rounded, roles, profile, counts, num)
    if smaller is not None:
        rounded.changes.append(f"(--recompute-num-layers {smaller[0]} also fits under the cost model, "
                               f"at {format_ms(smaller[1])} per iteration; this export keeps the safe {num})")
    return rounded, num


def _smallest_fitting(rounded, roles, profile, counts, num) -> tuple[int, float] | None:
    """The smallest N below `num` whose rounding still fits, with its iteration ms."""
    for n in range(num):
        trial = rounding.Rounded(stages=list(rounded.stages), setup=rounded.setup)
        rounding.first_k(trial, roles, [min(n, count) for count in counts])
        cost = rounding.evaluate(trial.ranks(), profile, trial.setup)
        if cost.feasible:
            return n, cost.iteration_ms
    return None


def _said(option: str, moe: bool) -> set[str]:
    """The modules that say (part of) a layer's option (none says attn, the whole attention module)."""
    parts = option.split(",")
    return {module for module, part, dense_ok, moe_ok in RECOMPUTE_MODULES
            if part in parts and (moe_ok if moe else dense_ok)}


def _selective(exact: rounding.Rounded, roles: rounding.Roles,
               profile: Profile) -> list[tuple[rounding.Rounded, tuple[str, ...]]]:
    """Every module list made of what the plan's selective options say, as the rounding that
    gives every decoder layer the option it means; none where the plan recomputes no layer
    selectively, or the profile has no option for a layer that a list gives it."""
    layers = {layer.name: layer for layer in profile.layers}
    moe = {name: layers[name].kind == "moe_block" for name in roles.decoder}
    said = set().union(*(_said(option, moe[name]) for s in exact.stages
                         for name, option in s.recompute.items() if option != "full" and name in moe))
    candidates = []
    for size in range(1, len(said) + 1):
        for modules in combinations(list(dict.fromkeys(m for m, *_ in RECOMPUTE_MODULES if m in said)), size):
            options = {name: recompute_modules_option(modules, moe[name], {o.name for o in layers[name].recompute_options})
                       for name in roles.decoder}
            if any(option != "none" and option not in {o.name for o in layers[name].recompute_options}
                   for name, option in options.items()):
                continue
            stages = [s.with_recompute({n: options[n] for n in rounding.decoder_layers(s, roles)})
                      for s in exact.stages]
            kinds = sorted({o for s in exact.stages for o in s.recompute.values()})
            change = (f"one --recompute-modules for every decoder layer: {' '.join(modules)} (the plan's per-layer "
                      f"options {', '.join(kinds)} become {', '.join(sorted(set(options.values()) - {'none'}))} "
                      "on every decoder layer)")
            candidates.append((rounding.Rounded(stages=stages, setup=exact.setup, changes=[*exact.changes, change]),
                               modules))
    return candidates


def layout(counts: list[int]) -> str:
    """'Et*19|t*20|t*20|t*21L' for decoder layers per stage [19, 20, 20, 21]."""
    def decoders(n: int) -> str:
        return "" if n == 0 else "t" if n == 1 else f"t*{n}"

    stages = [decoders(n) for n in counts]
    stages[0] = "E" + stages[0]
    stages[-1] = stages[-1] + "L"
    return "|".join(stages)


def shape_arguments(profile: Profile) -> list[str]:
    """Megatron-LM's flags for the model's shape, from what an analytic profile recorded of its
    config (a comment where the profile does not know it: a measured one, or an older file).
    Every value is typed (planner/emit/facts.py) and quoted for the shell."""
    known = facts.read(profile)
    model, seq_len = known.model, known.seq_len
    if model is None or seq_len is None:
        return ["# the model's shape (--hidden-size, --num-attention-heads, ...): give it; this profile does not "
                "record its architecture"]
    hidden, heads, kv = model.hidden_size, model.num_heads, model.num_kv_heads
    kinds, lines = layer_kind_arguments(model), [arg("--hidden-size", hidden), arg("--ffn-hidden-size", model.intermediate_size),
             arg("--num-attention-heads", heads)]
    if kv != heads:
        lines += [arg("--group-query-attention"), arg("--num-query-groups", kv)]
    if model.head_dim and model.head_dim != hidden // heads:
        lines.append(arg("--kv-channels", model.head_dim))
    lines += position_arguments(model, seq_len, arg)
    if model.style == "gpt":  # Megatron's defaults: LayerNorm, GELU, biases; positions as the model's
        kind = "learned_absolute" if model.max_position_embeddings else "rope" if model.rotates else "none"
        lines.append(arg("--position-embedding-type", kind))
        if kind == "rope":
            lines += rope_arguments(model)
        if model.mlp_act == "relu":
            lines.append("# ReLU MLP (OPT): Megatron-LM's flags give GELU, SwiGLU or squared ReLU; set "
                         "activation_func=torch.nn.functional.relu in its TransformerConfig")
    else:
        lines += [arg("--swiglu"), arg("--normalization", "RMSNorm"), arg("--position-embedding-type", "rope"),
                  arg("--disable-bias-linear")]
        if model.qkv_bias:
            lines.append(arg("--add-qkv-bias"))
        if model.qk_norm:
            lines.append(arg("--qk-layernorm"))
        lines += rope_arguments(model)
    lines += norm_arguments(model) + dropout_arguments(model)
    lines += moe_arguments(model, known.capacity_factor) + mla_arguments(model) + kinds  # what the block cannot be refused first
    if model.sliding_window:
        lines.append(f"# attention within a sliding window of {model.sliding_window} tokens: give it with your "
                     "Megatron-LM version's window setting (the plan's attention FLOPs assume it)")
    if not model.tie_word_embeddings:
        lines.append(arg("--untie-embeddings-and-output-weights"))
    return lines + vocab_arguments(model.vocab_size, known.tp)


def dropout_arguments(model) -> list[str]:
    """Megatron-LM drops at 0.1 unless told (--hidden-dropout: the residual dropouts and the
    embedding's; --attention-dropout): a model that does not drop says 0, which keeps no mask; one
    that drops keeps Megatron-LM's 0.1 (the profile records whether, not the probability)."""
    residual, embedding, attention = (model.drops(which) for which in ("residual", "embedding", "attention"))
    lines = [] if residual or embedding else [arg("--hidden-dropout", 0)]
    if residual != embedding:
        lines.append(f"# the model drops {'after its blocks' if residual else 'its embedding'} only; Megatron-LM's "
                     f"--hidden-dropout sets both: the plan's masks are the model's")
    if not attention:
        lines.append(arg("--attention-dropout", 0))
    if residual or embedding or attention:
        lines.append("# dropout at Megatron-LM's default probability 0.1: give your model's (the memory is the same)")
    return lines


def vocab_arguments(vocab_size: int, tp: int) -> list[str]:
    """Megatron-LM pads the tokenizer's vocabulary up to a multiple of
    --make-vocab-size-divisible-by (default 128) x the tensor-parallel size: 128256 at TP 4 would
    become 128512 rows, more than the model and the plan have. The largest power-of-two divisor
    (up to 128) that keeps the model's vocabulary a multiple keeps it as it is."""
    divisor = next((d for d in (128, 64, 32, 16, 8, 4, 2, 1) if vocab_size % (d * tp) == 0), None)
    if divisor is None:
        return [f"# vocabulary {vocab_size}: from your tokenizer; Megatron-LM pads it to a multiple of the "
                f"tensor-parallel size {tp}, which does not divide it: the padded rows are not in the plan"]
    return [f"# vocabulary {vocab_size}: from your tokenizer; this divisor keeps Megatron-LM's padding (to a multiple "
            f"of divisor x tensor-parallel size) at the model's {vocab_size}",
            arg("--make-vocab-size-divisible-by", divisor)]


# Megatron-LM's defaults (megatron/training/arguments.py): --rotary-base 10000 (an int),
# --norm-epsilon 1e-5; --use-rope-scaling applies Llama 3.1's scaling by --rope-scaling-factor
MEGATRON_ROTARY_BASE = 10000


def rope_arguments(model: facts.ModelFacts) -> list[str]:
    """The rotary base (rope_theta) and Llama 3.1's rope scaling, which Megatron-LM would otherwise train at its
    own defaults: another model. Refused where the profile does not know them, or Megatron-LM cannot say them."""
    if model.rope_theta is None:
        raise UserError("this profile does not record the model's rope_theta (the --arch-config it was made from "
                        "names none, or an older ckplan made it), and Megatron-LM's default rotary base "
                        f"({MEGATRON_ROTARY_BASE}) may train another model; write the model's rope_theta into the "
                        "config and profile it again (`ckplan profile --arch/--arch-config`)")
    if model.rope_theta != int(model.rope_theta):
        raise UserError(f"the model's rope_theta {model.rope_theta:g} is not a whole number, and Megatron-LM's "
                        "--rotary-base takes an integer; this export cannot reproduce the model")
    lines = [arg("--rotary-base", int(model.rope_theta))]
    scaling = model.rope_scaling
    if scaling is not None and scaling.type == "llama3":
        lines += [arg("--use-rope-scaling"), arg("--rope-scaling-factor", scaling.factor)]
    elif scaling is not None and not model.kv_lora_rank:
        raise UserError(f"the model's rope_scaling is {scaling.type} (factor {scaling.factor:g}), which Megatron-LM's "
                        "GPT flags do not express (--use-rope-scaling is Llama 3.1's); this export cannot reproduce "
                        "the model")
    elif scaling is not None:
        lines.append(f"# rope scaling {scaling.type}, factor {scaling.factor:g}: give it with your Megatron-LM "
                     "version's multi-latent-attention rope settings (--rope-type)")
    return lines


def norm_arguments(model: facts.ModelFacts) -> list[str]:
    """The norms' epsilon (rms_norm_eps / layer_norm_epsilon)."""
    if model.norm_eps is None:
        raise UserError("this profile does not record the model's norm epsilon (the --arch-config it was made from "
                        "names no rms_norm_eps, or an older ckplan made it), and Megatron-LM's default (1e-5) may train "
                        "another model; write the model's rms_norm_eps into the config and profile it again")
    return [arg("--norm-epsilon", model.norm_eps)]


def moe_arguments(model: facts.ModelFacts, capacity_factor: float | None) -> list[str]:
    """The experts as the profile charged them: top-k routing to num_experts experts of width
    moe_ffn_hidden_size, the shared experts as one SwiGLU of their summed width, dense layers by
    --moe-layer-freq; one grouped GEMM over the experts (the profile's backward transient holds
    every expert's two gradients at once, as a grouped matmul builds them) and the all-to-all
    token dispatcher (the cost model's all-to-all term)."""
    if not model.num_experts:
        return []
    lines = [arg("--num-experts", model.num_experts), arg("--moe-router-topk", model.num_experts_per_tok),
             arg("--moe-ffn-hidden-size", model.moe_intermediate_size), arg("--moe-grouped-gemm"),
             arg("--moe-token-dispatcher-type", "alltoall")]
    if model.num_shared_experts:
        lines.append(arg("--moe-shared-expert-intermediate-size",
                         model.num_shared_experts * model.shared_intermediate_size))
    if model.shared_expert_gate:
        lines.append(arg("--moe-shared-expert-gate"))
    dense = set(model.dense_layers)
    if dense:
        lines.append(arg("--moe-layer-freq", layer_freq([int(i not in dense) for i in range(model.num_layers)])))
    if capacity_factor not in (None, 1, 1.0):
        lines += [arg("--moe-expert-capacity-factor", capacity_factor), arg("--moe-pad-expert-input-to-capacity")]
    else:
        lines.append("# routing charged at perfect balance (--capacity-factor 1): Megatron-LM drops no tokens by "
                     "default, so an unbalanced router holds more than planned")
    lines.append("# router details (score function, group-limited routing, expert bias, aux-loss coefficient): "
                 "from the model's config; they change no memory the plan charges")
    if model.num_mtp_layers:
        lines.append(f"# the config's {model.num_mtp_layers} multi-token-prediction module(s) are not planned; "
                     "--mtp-num-layers adds them to the last stage")
    return lines


def layer_freq(pattern: list[int]) -> str:
    """Megatron-LM's --moe-layer-freq list expression, runs written as repeats: "([0]*3+[1]*58)"."""
    runs: list[list[int]] = []
    for value in pattern:
        if runs and runs[-1][0] == value:
            runs[-1][1] += 1
        else:
            runs.append([value, 1])
    return "(" + "+".join(f"[{int(value)}]*{int(count)}" for value, count in runs) + ")"


def mla_arguments(model: facts.ModelFacts) -> list[str]:
    """Multi-head latent attention: the latent ranks and the per-head widths (no --q-lora-rank
    where queries come straight from the hidden state, DeepSeek-V2-Lite)."""
    if not model.kv_lora_rank:
        return []
    lines = [arg("--multi-latent-attention"), arg("--kv-lora-rank", model.kv_lora_rank)]
    if model.q_lora_rank:
        lines.append(arg("--q-lora-rank", model.q_lora_rank))
    return lines + [arg("--qk-head-dim", model.qk_nope_head_dim), arg("--qk-pos-emb-head-dim", model.qk_rope_head_dim),
                    arg("--v-head-dim", model.v_head_dim)]


# what bash reads as one plain word, and what it reads literally inside double quotes
_PLAIN = re.compile(r"[A-Za-z0-9_.,:/=+@%-]+")
_QUOTABLE = re.compile(r"[A-Za-z0-9_.,:/=+@%*|()\[\] -]+")


def word(value: object) -> str:
    """One value as one bash word: a number written as a number (bool and NaN refused), text
    left plain, in double quotes where bash would glob or split it (a layout's '*' and '|'),
    else quoted by shlex: nothing in it is expanded or run."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise UserError(f"a Megatron-LM argument got {value!r}, which is not a number or a word; re-create the "
                        "profile and plan with `ckplan profile` and `ckplan solve`")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UserError(f"a Megatron-LM argument got {value!r}, which is not a finite number")
        value = repr(value) if value != int(value) or abs(value) >= 1e16 else repr(value).removesuffix(".0")
    text = str(value)
    if _PLAIN.fullmatch(text):
        return text
    if _QUOTABLE.fullmatch(text):
        return f'"{text}"'
    return shlex.quote(text)


def arg(flag: str, *values: object) -> str:
    """A flag and its values, each one quoted bash word."""
    return " ".join([flag, *(word(value) for value in values)])


def _arguments(rounded: rounding.Rounded, roles: rounding.Roles, profile: Profile, num: int,
               modules: tuple[str, ...] = ()) -> str:
    setup = rounded.setup
    counts, _ = rounding.decoder_counts(rounded.stages, roles)
    known = facts.read(profile)
    tp = known.tp
    if known.model is not None and known.model.num_layers != len(roles.decoder):
        raise UserError(f"the profile records a model of {known.model.num_layers} decoder layers and lists "
                        f"{len(roles.decoder)}; re-create the profile with `ckplan profile`")
    lines = [
        arg("--num-layers", len(roles.decoder)),
        *shape_arguments(profile),
        arg("--pipeline-model-parallel-size", setup.pipeline.stages),
        *_split_arguments(counts, setup.pipeline.stages, setup.pipeline.chunks),
    ]
    if num:
        lines += [f"# recompute the first N decoder layers of every {'virtual ' if setup.pipeline.chunks > 1 else ''}stage",
                  arg("--recompute-granularity", "full"), arg("--recompute-method", "block"),
                  arg("--recompute-num-layers", num)]
    if modules:
        lines += ["# recompute these submodules of every decoder layer",
                  arg("--recompute-granularity", "selective"), arg("--recompute-modules", *modules)]
    lines += megatron_window.arguments(rounded, profile, arg) + [arg("--micro-batch-size", setup.pipeline.micro_batch_size),
              f"# {setup.pipeline.microbatches} microbatches per pipeline: global batch = microbatches x micro batch x dp",
              arg("--global-batch-size", setup.pipeline.microbatches * setup.pipeline.micro_batch_size
                  * setup.data_parallel.dp // setup.training.context_parallel)]  # the setup's dp counts the cp ranks
    if tp > 1:
        lines.append(arg("--tensor-model-parallel-size", tp))
    if setup.training.context_parallel > 1:
        lines.append(arg("--context-parallel-size", setup.training.context_parallel))
        if setup.training.cp_comm is not None:
            lines.append(arg("--cp-comm-type", setup.training.cp_comm))
    if any(layer.expert_param_count for layer in profile.layers):
        lines.append(arg("--expert-model-parallel-size", setup.data_parallel.ep))
        if tp > 1:  # megatron-core's default, said: the profile splits the experts over the TP group
            lines.append(arg("--expert-tensor-parallel-size", tp))
        lines.append("# the all-to-all is charged on the critical path: --overlap-moe-expert-parallel-comm (off by "
                     "default) would hide part of it")
    if known.sp:
        lines.append(arg("--sequence-parallel"))
    if setup.training.precision in ("bf16-mixed", "fp16-mixed"):  # fp32: neither (params_dtype torch.float)
        lines.append(arg("--bf16" if setup.training.precision == "bf16-mixed" else "--fp16"))
    lines += _zero_arguments(setup) + _ddp_arguments(setup)
    lines += _test_settings(setup.training)
    body = "\n".join(f"    {rounding.one_line(line)}" for line in lines)
    return f"CKPLAN_MEGATRON_ARGS=(\n{body}\n)\n# pretrain_gpt.py ... \"${{CKPLAN_MEGATRON_ARGS[@]}}\"\n"


def _zero_arguments(setup) -> list[str]:
    """ZeRO 1 as the distributed optimizer; ZeRO 2 and 3 (one stage: dp_support rounds a pipeline's to 1)
    as Megatron FSDP sharding gradients, and weights too, as --from-megatron reads them back (FSDP_ZERO).
    Megatron-LM d98e8a64 arguments.py: Megatron FSDP (v1) sets the distributed optimizer itself and
    asserts --ckpt-format fsdp_dtensor."""
    zero = setup.data_parallel.zero
    if zero == 0:
        return []
    lines = [arg("--use-distributed-optimizer")]
    if zero >= 2:
        strategy = {2: "optim_grads", 3: "optim_grads_params"}[zero]
        lines += [arg("--use-megatron-fsdp"), arg("--data-parallel-sharding-strategy", strategy),
                  arg("--ckpt-format", "fsdp_dtensor")]
    replicas = dataparallel.replicas(setup)
    if replicas > 1:  # megatron-core: the DP domain split into this many distributed-optimizer copies
        lines.append(arg("--num-distributed-optimizer-instances", replicas))
    return lines


def _ddp_arguments(setup) -> list[str]:
    """Megatron-LM's DDP overlap as the plan was scored (planner/cost/megatron_dp.py): --overlap-grad-reduce where the
    reductions were overlapped (the runtime record's default where the plan did not say), the others where set."""
    dp = setup.data_parallel
    if dp.dp == 1:
        return []
    lines = [arg("--overlap-grad-reduce")] if dataparallel.overlaps_comm(setup) else []
    lines += [arg(flag) for flag, on in (("--overlap-param-gather", dp.overlap_param_gather and dp.zero == 1),
                                        ("--no-align-grad-reduce", not dp.align_grad_reduce),
                                        ("--no-align-param-gather", not dp.align_param_gather),
                                        ("--overlap-param-gather-with-optimizer-step", dp.param_gather_with_step),
                                        ("--fsdp-double-buffer", dp.fsdp_double_buffer)) if on]
    if dp.suggested_communication_unit_size:  # Megatron-FSDP's (planner/cost/megatron_fsdp.py)
        lines.append(arg("--suggested-communication-unit-size", dp.suggested_communication_unit_size))
    return lines + ([arg("--ddp-bucket-size", dp.bucket_params)] if dp.bucket_params else [])


def _test_settings(training) -> list[str]:
    """The scored settings that are Megatron-LM flags of the same names (planner/cost/jobsettings.py, hosttime.py); deterministic
    mode with the environment it asks (arguments.py 1528-1537, extensions/transformer_engine.py 1566-1572, 6e091e1b)."""
    lines = [arg(flag) for flag, on in (("--no-gradient-accumulation-fusion", training.unfused_grad_accumulation),
                                        ("--log-params-norm", training.log_params_norm),
                                        ("--log-num-zeros-in-grad", training.log_num_zeros_in_grad),
                                        ("--grad-reduce-in-bf16", training.grad_reduce_bf16)) if on] + [
        arg("--timing-log-level", level) for level in [getattr(training, "timing_log_level", 0)] if level]
    if training.te_cross_entropy:  # planner/cost/bridgesettings.py: Transformer Engine's fused loss
        lines += [arg("--cross-entropy-loss-fusion"), arg("--cross-entropy-fusion-impl", "te")]
    elif training.fused_cross_entropy:  # Megatron's own fused (compiled) loss, the native implementation
        lines.append(arg("--cross-entropy-loss-fusion"))
    if training.local_layers:  # the record's local_spec_buffer: Megatron-core's local spec
        lines.append(arg("--transformer-impl", "local"))
    if training.deterministic:
        lines += ["# --deterministic-mode needs NCCL_ALGO=Ring (or Tree) and NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 set",
                  arg("--deterministic-mode")]
    return lines + [f"# scored with {env} in the launch's environment" for env, on in (
        ("NCCL_ALGO=Ring NCCL_PROTO=simple", training.nccl_ring_simple), ("NCCL_NVLS_ENABLE=0", training.nccl_nvls_off)) if on]


def _split_arguments(counts: list[int], num_ranks: int, chunks: int) -> list[str]:
    """The pipeline split: the layout (P·V stages with virtual stages), and the flags that say
    the same where the split is that regular."""
    lines = ["# stages split by '|': E embedding, t decoder layer, L final norm + output layer + loss"]
    if chunks > 1:
        lines.append(f"# {num_ranks * chunks} virtual stages in pipeline order: rank r runs stages r, {num_ranks}+r, ...; "
                     f"the layout sets {chunks} virtual stages per rank (interleaved 1F1B)")
    lines.append(arg("--pipeline-model-parallel-layout", layout(counts)))
    middle = set(counts[1:-1])
    if chunks > 1 and len(set(counts)) == 1:
        lines.append(f"# or, the same split without a layout: --num-layers-per-virtual-pipeline-stage {counts[0]}")
    elif chunks == 1 and len(counts) >= 2 and len(middle) <= 1 and 0 not in middle:
        lines.append(f"# or, the same split without a layout: --decoder-first-pipeline-num-layers {counts[0]} "
                     f"--decoder-last-pipeline-num-layers {counts[-1]}")
    return lines
