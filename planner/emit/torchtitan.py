"""A plan as torchtitan configuration: `module_fqns_per_model_part` (module FQNs per stage),
the schedule by name, and activation checkpointing of exactly the plan's layers.

Facts from torchtitan's code: 0.2.x reads a TOML job file (`--job.config_file`,
config/job_config.py) whose `[activation_checkpoint]` is one setting for every stage
(mode none|full|selective, selective_ac_option "N": every Nth block a rank builds, by a
process-wide counter), and names the head `output`; 0.3.0 is configured in Python
(`--module M --config FN`, a function returning Trainer.Config), names the head `lm_head`,
and builds activation checkpointing from a policy config (`ac_config.build().apply(model)`),
so a small policy class in the config file can name layers. main from 73aed7f6c (2026-08-20)
is configured as 0.3.0 is but counts the batch in tokens (num_tokens_per_microbatch_per_dp_rank,
num_pp_microbatches: planner/emit/titan_keys.py names each version's keys). 0.1.x has no
module_fqns_per_model_part.

Chunked schedules: module_fqns_per_model_part lists the P·V pipeline stages in order, and
distributed/pipeline_parallel.py places them as torch's schedules do (_get_pp_rank_to_stage_
indices_mapping: "v" for ZBVZeroBubble and DualPipeV, rank r holding stages r and 2P-1-r; a loop
otherwise, r + c·P), the placement ckplan plans with; the schedule is named as torch's
get_schedule_class knows it (Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV).

Selective recompute (0.3.0): the policy in the generated file checkpoints a layer's parts as
ckplan's options do (planner/runtime/recompute.py), on torchtitan's block submodules (models/llama3,
qwen3, deepseek_v3: attention, attention.inner_attention, feed_forward or moe, attention_norm,
ffn_norm); save-matmuls saves every matmul and attention output, where torchtitan's own
SelectiveAC (distributed/activation_checkpoint.py) recomputes every second matmul.

Mixtures of experts (0.3.0): the experts, router and latent attention come from the model's own
config function (torchtitan.models.deepseek_v3, qwen3: its MoE models); the export sets
`parallelism.expert_parallel_degree`, which borrows its ranks from FSDP and TP
(config/configs.py: dp_shard * cp * tp == efsdp * ep, experts FSDP-sharded over efsdp).
"""

from __future__ import annotations

import json
import re

from planner.cost import costmodel, dataparallel
from planner.emit import facts, layer_kinds, rounding, scored_as, titan_keys
from planner.errors import UserError
from planner.schema import Plan, Profile

TARGET = "torchtitan"
NEWEST_RELEASE = titan_keys.NEWEST_RELEASE
# torchtitan's own config functions for the architectures ckplan profiles by name
_BASE_CONFIGS = {
    "llama3-8b": "torchtitan.models.llama3.config_registry:llama3_8b",
    "llama3-70b": "torchtitan.models.llama3.config_registry:llama3_70b",
    "llama3.1-405b": "torchtitan.models.llama3.config_registry:llama3_405b",
    "deepseek-v3": "torchtitan.models.deepseek_v3.config_registry:deepseek_v3_671b",
    "deepseek-v2-lite": "torchtitan.models.deepseek_v3.config_registry:deepseek_v3_16b",
    "qwen3-30b-a3b": "torchtitan.models.qwen3.config_registry:qwen3_30b_a3b",
    **{f"qwen3-{n}": f"torchtitan.models.qwen3.config_registry:qwen3_{n.replace('.', '_')}" for n in ("0.6b", "1.7b", "14b", "32b")},
    **{f"gpt-oss-{n}": f"torchtitan.models.gpt_oss.config_registry:gpt_oss_{n}" for n in ("20b", "120b")},
}
# The model each of them builds, as ckplan's built-in of that name records it (torchtitan's llama3
# registry follows Meta's params.json: 8B 32 layers, 70B 80, 405B 126, rope_theta 500000, the
# Llama 3 tokenizer's 128256 tokens; deepseek_v3._671b 61 layers, 3 dense; deepseek_v3._16b, DeepSeek-V2-Lite's
# dimensions at b5bcd76c's deepseek_v3/__init__.py: 27 layers, 1 dense, 64 experts top 6; qwen3._30b_a3b 48;
# qwen3's and gpt_oss's others build model_registry(SIZE), the flavors configs/torchtitan.py FLAVORS reads), so
# a base that builds another model is refused at export, not trained in its place.
BASE_MODELS = {config: arch for arch, config in _BASE_CONFIGS.items()}
_COMPARED = ("num_layers", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "vocab_size", "head_size",
             "qkv_bias", "qk_norm", "tie_word_embeddings", "rope_theta", "num_experts", "num_experts_per_tok",
             "moe_intermediate_size", "num_shared_experts", "kv_lora_rank", "q_lora_rank")


CONFIG_FUNCTION = "ckplan_config"  # the function the Python export defines, torchtitan's --config


def module_name(plan_stem: str) -> str:
    """The module name of a plan's Python export (0.3.0, main): torchtitan's ConfigManager imports
    `--module NAME` with importlib.import_module (config/manager.py 99-131 at b5bcd76c, the same in
    0.3.0), so the file is NAME.py with NAME an identifier: the plan's stem, every character but
    ASCII letters, digits and _ made _, then `_torchtitan` (no keyword, and none of torchtitan's
    model shorthands, which ConfigManager would resolve to its own config_registry first)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", plan_stem) + "_torchtitan"
    return name if name.isidentifier() else "plan_" + name  # a stem starting with a digit


def export_name(plan_stem: str, version: str) -> str:
    """The file `export --to torchtitan` writes beside a plan: an importable NAME.py for a Python
    config version, STEM.torchtitan.toml for 0.2.x's job TOML."""
    return module_name(plan_stem) + ".py" if titan_keys.parse(version).python else plan_stem + ".torchtitan.toml"


def export(plan: Plan, profile: Profile, *, plan_file: str, version: str = NEWEST_RELEASE,
           base: str | None = None) -> rounding.Export:
    chosen_version = titan_keys.parse(version)
    python_config = chosen_version.python
    experts = any(layer.expert_param_count for layer in profile.layers)
    if experts:
        _check_experts(plan, profile, python_config)
    # torchtitan runs every schedule ckplan plans: only the ZeRO stage is rounded (and selective
    # recompute, in the TOML of 0.2)
    roles, rounded = rounding.decoder_start(plan, profile, TARGET, round_zero=_round_zero, selective=python_config)
    rounding.unwritable_as_full(rounded, TARGET, frozenset({"core-attn", "attn", "mlp", "mlp-act", "norm"}))  # the policy's PARTS
    head = chosen_version.head
    known = layer_kinds.torchtitan_checked(facts.read(profile))  # a model torchtitan builds, or one sentence
    tp = known.tp
    parts = fqns_per_stage(rounded, roles, head)
    checkpointed = [f"layers.{roles.decoder_index(n)}" for s in rounded.stages for n in s.checkpointed]
    if python_config:
        cannot = ["per-stage choice in its built-in AC policies (full, selective, memory-budget are one "
                  "setting for every stage); this file defines a policy keyed on layer FQNs instead."]
        scored = rounding.rescore(plan, profile, rounded)
        chosen = _base(known, base)
        _check_depth(chosen, len(roles.decoder))
        _check_base_model(chosen, known.model)
        selective = {f"layers.{roles.decoder_index(n)}": option for s in rounded.stages
                     for n, option in s.recompute.items() if option != "full"}
        body = _python_config(rounded, parts, checkpointed, chosen, len(roles.decoder), tp, experts,
                              selective=selective,
                              seq_len=known.seq_len, version=chosen_version, sp=known.sp)
        suffix = ".torchtitan.py"
    else:
        cannot = ["per-layer checkpointing in TOML: [activation_checkpoint] is one setting for every stage; "
                  "the TOML below takes the fastest uniform setting that fits, and the Python policy "
                  "at the end reproduces the plan exactly."]
        exact = rounded
        rounded, mode = _uniform(exact, roles, profile)
        scored = rounding.rescore(plan, profile, rounded)
        body = _toml(rounded, parts, mode, tp, known.seq_len, chosen_version) + "\n" + rounding.comment(_policy_022(checkpointed).splitlines(), "#")
        suffix = ".torchtitan.toml"
    if chosen_version.tokens and plan.setup.pipeline.micro_batch_size > 1:
        cannot.append("the microbatch as sequences: torchtitan main runs it as one window of tokens, attended "
                      "block-causally within each max_context_length span and each packed document (FlexAttention "
                      "by default, models/common/config_utils.py get_attention_config at b5bcd76c); ckplan scored "
                      "whole causal sequences, an upper bound where documents are shorter.")
    if not python_config and tp > 1 and not known.sp:
        cannot.append("tensor parallelism without sequence parallelism: torchtitan 0.2.x always runs it beside TP "
                      "(enable_sequence_parallel came in aa68af18e, 2026-03-29); export for 0.3.0 or main.")
    if plan.setup.comm.tp_overlap == "async-tp" and plan.setup.comm.tp > 1 and not _async_tp_runs(plan.setup):
        cannot.append("AsyncTP without the model compiled: torchtitan refuses enable_async_tensor_parallel unless "
                      "compile.enable with \"model\" in compile.components; left off here (plan with --compile).")
    if plan.setup.training.context_parallel > 1 and plan.setup.training.cp_comm == "p2p":
        cannot.append("context parallelism's p2p K/V exchange: torchtitan runs torch's context_parallel with its "
                      "default all-gather rotation (torch 2.13 _cp_options); set torch's "
                      "set_rotate_method('alltoall') yourself, or plan with --cp-comm allgather.")
    if plan.setup.data_parallel.offload:
        cannot.append("offloading the optimizer alone: training.enable_cpu_offload moves weights and gradients "
                      "to the host too (FSDP2's CPUOffloadPolicy); left off here.")
    if plan.setup.training.float8:
        cannot.append(titan_keys.float8_note(chosen_version, plan.setup.training.fp8_all_gather))
    cannot += titan_keys.loss_note(chosen_version, plan.setup)
    header = rounding.header_lines(plan_file, f"{TARGET} {_said(chosen_version)}", cannot, rounded, scored, plan_setup=plan.setup)
    return rounding.Export(TARGET, rounding.comment(header) + "\n" + body, suffix, rounded, scored, cannot)


def _said(version: titan_keys.Version) -> str:
    """The version as the header names it: main with the commits its keys were read between."""
    if version.name == titan_keys.MAIN:
        return f"main (from 73aed7f6c, read at {titan_keys.MAIN_READ_AT})"
    return version.name


def _compile_lines(setup, prefix: str, *, toml: bool = False) -> str:
    """torch.compile as the plan was scored (scored_as.compiled_components): compile.enable, and
    compile.components where it is on (Trainer.Config.compile, torchtitan/trainer.py 111 and
    config/configs.py 293-303 at b5bcd76c; the TOML's [compile] since v0.2.0, config/job_config.py
    637-645), written either way so that a base config or job file that compiles does not run
    otherwise than the plan was scored."""
    compiled = scored_as.compiled_components(setup)
    enable = ("true" if compiled else "false") if toml else str(bool(compiled))
    lines = f"\n{prefix}enable = {enable}"
    if compiled:
        lines += f"\n{prefix}components = {json.dumps(compiled)}"
    return lines + ("" if toml else _async_tp_line(setup, prefix, toml))


def _async_tp_line(setup, prefix: str, toml: bool) -> str:
    """AsyncTP where the plan was scored with it (--tp-overlap async-tp): 0.2.x's
    parallelism.enable_async_tensor_parallel (config/job_config.py 357 at 238fa9953e4a), compile's from
    737594746 (2026-08-12; config/configs.py 295 in 0.3.0, the same at b5bcd76c). torchtitan refuses it
    unless compile.enable with "model" in its components: the plan then carries a cannot-say note."""
    if setup.comm.tp_overlap != "async-tp" or setup.comm.tp <= 1 or not _async_tp_runs(setup):
        return ""
    return f"\n{prefix}enable_async_tensor_parallel = {'true' if toml else 'True'}"


def _async_tp_runs(setup) -> bool:
    return "model" in (scored_as.compiled_components(setup) or [])


def fqns_per_stage(rounded: rounding.Rounded, roles: rounding.Roles, head: str) -> list[list[str]]:
    """torchtitan module FQNs per stage: tok_embeddings, layers.N, norm and the head."""
    last = len(rounded.stages) - 1
    return [(["tok_embeddings"] if s == 0 else [])
            + [f"layers.{roles.decoder_index(n)}" for n in rounding.decoder_layers(stage, roles)]
            + (["norm", head] if s == last else [])
            for s, stage in enumerate(rounded.stages)]


def _base(known: facts.Facts, base: str | None) -> str:
    base = base or _BASE_CONFIGS.get(known.arch or "")
    if base is None or ":" not in base or not _python_names(base):
        raise UserError("name the torchtitan config function this plan refines with --torchtitan-base "
                        "MODULE:FUNCTION, e.g. torchtitan.models.llama3.config_registry:llama3_70b")
    return base


# ---------------------------------------------------------------- 0.3: Python config


def _tp_line(tp: int, prefix: str, sp: bool | None = None) -> str:
    """The profile's tensor parallelism, which its numbers assume, and from 0.3.0 (`sp` given) whether
    sequence parallelism runs beside it: ParallelismConfig.enable_sequence_parallel, default True, since
    aa68af18e (2026-03-29; config/configs.py 160 in 0.3.0, 169 at b5bcd76c). 0.2.x always runs it."""
    if tp <= 1:
        return ""
    line = f"\n{prefix}tensor_parallel_degree = {tp}"
    return line if sp is None else line + f"\n{prefix}enable_sequence_parallel = {sp}"


def _dp_lines(setup, prefix: str) -> str:
    """Data parallelism as FSDP2/HSDP degrees: shard over the ZeRO group, replicate across the
    groups; without ZeRO, replicate only (DDP). Under context parallelism the setup's dp and shard
    group count the cp ranks, which torchtitan's FSDP mesh adds itself (dp_shard x cp,
    torchtitan/distributed/parallel_dims.py 281 at b5bcd76c): its shard degree is the group / cp."""
    cp = setup.training.context_parallel
    cp_line = f"\n{prefix}context_parallel_degree = {cp}" if cp > 1 else ""
    if setup.data_parallel.dp == 1:
        return cp_line
    shard = dataparallel.shard_size(setup)
    return (f"\n{prefix}data_parallel_shard_degree = {max(shard // cp, 1)}"
            f"\n{prefix}data_parallel_replicate_degree = {setup.data_parallel.dp // max(shard, cp)}{cp_line}")


def _round_zero(rounded: rounding.Rounded) -> None:
    """torchtitan shards with FSDP2 only, and its pipeline (torch.distributed.pipelining) keeps
    FSDP2's weights and gradients whole until the last backward: ZeRO 3 kept whole through the
    iteration, which the cost model scores as ZeRO 1's memory and traffic."""
    setup = rounded.setup
    ran = dataparallel.as_torchtitan_runs(setup)
    if ran == setup:
        return
    rounded.setup = ran
    rounded.changes.append(f"ZeRO-{setup.data_parallel.zero} ({setup.data_parallel.zero_gather}) as FSDP2 beside torch.distributed.pipelining: "
                           "weights and gradients stay whole until the last backward, one reduce-scatter and one "
                           "all-gather per iteration")


def _check_depth(base: str, num_layers: int) -> None:
    """A known base config of another depth than the plan's is refused (the generated file checks
    any base again when it runs)."""
    from planner.models import archs

    arch = BASE_MODELS.get(base)
    known = None if arch is None else archs.arch(arch).num_layers
    if known is not None and known != num_layers:
        raise UserError(f"--torchtitan-base {base} has {known} decoder layers and this plan {num_layers}; name the "
                        "config function of the model the plan was made for")


def _check_base_model(base: str, model: facts.ModelFacts | None) -> None:
    """A torchtitan config function ckplan knows, whose model differs from the plan's in any
    dimension (or bias, rotary base, experts), is refused: it would train another model."""
    from planner.models import archs

    arch = BASE_MODELS.get(base)
    if arch is None or model is None:
        return
    built = facts.ModelFacts.model_validate(archs.arch(arch).facts())
    differ = [f"{name} {getattr(model, name)} (the base: {getattr(built, name)})" for name in _COMPARED
              if getattr(model, name) is not None and getattr(model, name) != getattr(built, name)]
    if differ:
        raise UserError(f"--torchtitan-base {base} builds {arch}, not this plan's model: {'; '.join(differ)}; name "
                        "the config function of the model the plan was made for")


def _python_names(base: str) -> bool:
    """MODULE:FUNCTION is a dotted module path and a function name: nothing else may enter the
    generated `from MODULE import FUNCTION`."""
    module, function = base.split(":", 1)
    return all(part.isidentifier() for part in module.split(".")) and function.isidentifier()


def _check_experts(plan: Plan, profile: Profile, python_config: bool) -> None:
    """One sentence for a mixture-of-experts plan torchtitan cannot run as planned."""
    setup, tp = plan.setup, facts.read(profile).tp
    if not python_config:
        raise UserError("the plan's model is a mixture of experts; its torchtitan export writes "
                        "expert_parallel_degree for torchtitan 0.3.0 (its MoE models' Python configs): use "
                        "--torchtitan-version 0.3.0")
    if setup.data_parallel.ep > 1 and tp > 1:
        raise UserError(f"torchtitan's expert parallelism takes its ranks from FSDP and TP, so with --tp {tp} its "
                        "experts are not split over the tensor-parallel group as the profile splits them; profile "
                        "with --tp 1 for a torchtitan export, or export to megatron")
    if setup.data_parallel.ep > 1 and dataparallel.shard_size(setup) % setup.data_parallel.ep:
        raise UserError(f"torchtitan's expert_parallel_degree {setup.data_parallel.ep} must divide its FSDP shard "
                        f"degree ({dataparallel.shard_size(setup)} here: --zero 0 shards nothing); solve with --zero 1 "
                        "or more and a shard group that --ep divides")


def _ep_line(setup, experts: bool, prefix: str) -> str:
    """torchtitan's expert parallelism (0.3.0 ParallelismConfig.expert_parallel_degree)."""
    return f"\n{prefix}expert_parallel_degree = {setup.data_parallel.ep}" if experts else ""


# ckplan's schedule names -> torch's (torch.distributed.pipelining.schedules.get_schedule_class)
SCHEDULE_NAMES = {"1F1B": "1F1B", "GPipe": "GPipe", "interleaved-1F1B": "Interleaved1F1B",
                  "ZB": "InterleavedZeroBubble", "ZBV": "ZBVZeroBubble", "DualPipeV": "DualPipeV"}


def _python_config(rounded, parts, checkpointed, base: str, num_layers: int, tp: int, experts: bool = False, *,
                   sp: bool = True, selective: dict[str, str] | None = None,
                   seq_len: int | None = None, version: titan_keys.Version | None = None) -> str:
    module, function = base.split(":", 1)
    version = version or titan_keys.parse(NEWEST_RELEASE)
    setup = rounded.setup
    selective = selective or {}
    ac = ("CkplanAC.Config(layers=CHECKPOINTED" + (", selective=SELECTIVE)" if selective else ")")
          if checkpointed or selective else "None")
    return f'''"""Run: save this file under a name Python can import (letters, digits and _, e.g. ckplan_plan.py) on
the PYTHONPATH, then torchrun ... -m torchtitan.train --module ckplan_plan --config ckplan_config
(torchtitan's ConfigManager imports --module by name: a name with a dot or a dash is not found)."""
from dataclasses import dataclass, field

import torch.nn as nn
{_SELECTIVE_IMPORTS if selective else ""}
from torchtitan.distributed.activation_checkpoint import FullAC
from {module} import {function} as base_config
{_SELECTIVE_PARTS if selective else ""}

class CkplanAC(FullAC):
    """Activation checkpointing of the decoder layers named in `layers` (whole layers) and in
    `selective` (layer -> ckplan recompute option: parts of the layer), no others."""

    @dataclass(kw_only=True, slots=True)
    class Config(FullAC.Config):
        layers: list[str] = field(default_factory=list)
        selective: dict[str, str] = field(default_factory=dict)

    def apply(self, model: nn.Module) -> None:
        layers = model.get_submodule("layers")
        for layer_id, block in list(layers.named_children()):
            fqn = f"layers.{{layer_id}}"
            if fqn in self.config.layers:
                layers.register_module(layer_id, self._wrap_block(block, base_fqn=fqn))
            elif fqn in self.config.selective:
                layers.register_module(layer_id, checkpoint_parts(block, self.config.selective[fqn], self.config))


MODULE_FQNS_PER_MODEL_PART = {_py_list(parts)}
CHECKPOINTED = {checkpointed!r}{f"{chr(10)}SELECTIVE = {selective!r}" if selective else ""}


def ckplan_config():
    config = base_config()
    num_layers = len(config.model_spec.model.layers)
    if num_layers != {num_layers}:
        raise ValueError(f"this ckplan plan is for {num_layers} decoder layers; {function} has {{num_layers}}")
    config.parallelism.pipeline_parallel_degree = {setup.pipeline.stages}
    config.parallelism.module_fqns_per_model_part = MODULE_FQNS_PER_MODEL_PART
    config.parallelism.pipeline_parallel_schedule = "{SCHEDULE_NAMES[setup.pipeline.schedule]}"
{titan_keys.microbatch_line(version, setup, "    config.parallelism.")}{_tp_line(tp, "    config.parallelism.", sp)}{_dp_lines(setup, "    config.parallelism.")}{_ep_line(setup, experts, "    config.parallelism.")}
{titan_keys.batch_lines(version, setup, seq_len, "    config.training.")}{titan_keys.graphs_line(version, "    config.training.")}{titan_keys.loss_lines(version, setup, "    ")}
    config.activation_checkpoint = {ac}{_compile_lines(setup, "    config.compile.")}
    return config
'''


_SELECTIVE_IMPORTS = """import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
"""


# The policy's selective half: ckplan's options (planner/runtime/recompute.py) on torchtitan's block
# submodules: core-attn the attention kernel alone (attention.inner_attention: Q, K and V kept), attn the
# attention submodule whole
_SELECTIVE_PARTS = '''

# ckplan's recompute options on torchtitan's blocks (planner/runtime/recompute.py): the submodules each
# part checkpoints; mlp-act saves the MLP's matmul outputs and recomputes its activation,
# save-matmuls the whole block saving every matmul and attention output
_aten = torch.ops.aten
MATMULS = {_aten.mm, _aten.addmm, _aten.bmm, _aten.baddbmm, _aten.linear, _aten.matmul, _aten._scaled_mm,
           *(getattr(_aten, name) for name in ("_grouped_mm",) if hasattr(_aten, name))}
ATTENTION = {_aten._scaled_dot_product_flash_attention, _aten._scaled_dot_product_efficient_attention,
             _aten._scaled_dot_product_cudnn_attention, _aten._flash_attention_forward,
             _aten._efficient_attention_forward, _aten._scaled_dot_product_flash_attention_for_cpu,
             torch._higher_order_ops.flex_attention}
PARTS = {"core-attn": ["attention.inner_attention"], "attn": ["attention"], "mlp": ["feed_forward", "moe"],
         "mlp-act": ["feed_forward", "moe"]}


def saving(ops):
    """A selective checkpoint context that saves the outputs of `ops` and recomputes the rest."""
    def policy(ctx, func, *args, **kwargs):
        saved = getattr(func, "overloadpacket", func) in ops
        return CheckpointPolicy.MUST_SAVE if saved else CheckpointPolicy.PREFER_RECOMPUTE
    return lambda: create_selective_checkpoint_contexts(policy)


def _is_norm(module: nn.Module) -> bool:
    name = type(module).__name__
    return "Norm" in name and "BatchNorm" not in name


def _submodules(block: nn.Module, part: str) -> list[str]:
    if part == "norm":
        return [name for name, module in block.named_modules() if name and _is_norm(module)]
    names = dict(block.named_modules())
    return [name for name in PARTS[part] if name in names]


def checkpoint_parts(block: nn.Module, option: str, config) -> nn.Module:
    """`block` with the parts the ckplan option names (comma-joined) checkpointed, none inside another."""
    kwargs = {"preserve_rng_state": config.preserve_rng_state, "determinism_check": config.determinism_check,
              "early_stop": False, "debug": config.debug}
    if option == "save-matmuls":
        return checkpoint_wrapper(block, context_fn=saving(MATMULS | ATTENTION), **kwargs)
    chosen = {}
    for part in option.split(","):
        found = _submodules(block, part)
        if not found:
            raise ValueError(f"ckplan's {part!r} names no submodule of {type(block).__name__}")
        chosen.update(dict.fromkeys(found, part))
    for name, part in chosen.items():
        if any(name.startswith(other + ".") for other in chosen):
            continue  # inside another checkpointed part: recomputed with it
        owner_name, _, child = name.rpartition(".")
        owner = block.get_submodule(owner_name)
        context = {"context_fn": saving(MATMULS)} if part == "mlp-act" else {}
        owner.register_module(child, checkpoint_wrapper(getattr(owner, child), **context, **kwargs))
    return block
'''


def _py_list(parts: list[list[str]]) -> str:
    return "[\n" + "".join(f"    {part!r},\n" for part in parts) + "]"


# ---------------------------------------------------------------- 0.2: TOML


def _built_by_rank(rounded: rounding.Rounded, roles) -> list[list[str]]:
    """The decoder layers each rank builds, in the order it builds them (its stages in increasing
    order, as pipeline_parallel.py splits them): what 0.2's selective_ac_option counts."""
    if rounded.setup.pipeline.chunks == 1:
        return [rounding.decoder_layers(stage, roles) for stage in rounded.stages]
    order = costmodel.schedule_of(rounded.setup)
    return [[n for k in order.stages_of(rank) for n in rounding.decoder_layers(rounded.stages[k], roles)]
            for rank in range(order.num_ranks)]


def _uniform(exact: rounding.Rounded, roles, profile: Profile):
    """The fastest setting [activation_checkpoint] can give every stage that fits: none, every
    Nth decoder layer a rank builds (selective_ac_option = N), or full."""
    built = _built_by_rank(exact, roles)
    options = [("none", None)] + [("selective", n) for n in range(max(map(len, built)), 1, -1)] + [("full", 1)]
    candidates = []
    for _mode, every in options:
        chosen = {n for names in built for i, n in enumerate(names, start=1) if every and i % every == 0}
        stages = [stage.with_checkpointed([n for n in stage.layers if n in chosen]) for stage in exact.stages]
        candidates.append(rounding.Rounded(stages=stages, setup=exact.setup, changes=list(exact.changes)))
    chosen, fits = rounding.scored_choice(candidates, profile)
    mode, every = options[candidates.index(chosen)]
    described = {"none": "no checkpointing", "full": "every decoder layer checkpointed"}.get(
        mode, f"one decoder layer in every {every} a rank builds checkpointed")
    chosen.changes.append(f"one [activation_checkpoint] for all stages: {described}")
    if not fits:
        chosen.changes.append("no uniform setting fits; this one comes closest")
    return chosen, (mode, every)


def _toml(rounded, parts, mode, tp: int, seq_len: int | None, version: titan_keys.Version) -> str:
    setup = rounded.setup
    name, every = mode
    lines = ["# merge into your job TOML (--job.config_file)", "[parallelism]",
             f"pipeline_parallel_degree = {setup.pipeline.stages}",
             f"pipeline_parallel_schedule = \"{SCHEDULE_NAMES[setup.pipeline.schedule]}\"",
             f"{titan_keys.microbatch_line(version, setup, '')}{_tp_line(tp, '')}{_dp_lines(setup, '')}"
             f"{_async_tp_line(setup, '', True)}",
             "module_fqns_per_model_part = ["]
    lines += [f"    {json.dumps(part)}," for part in parts]
    lines += ["]", "", "[training]", *titan_keys.batch_lines(version, setup, seq_len, "").splitlines(), "",
              "[activation_checkpoint]", f"mode = \"{name}\""]
    if name == "selective":
        lines.append(f"selective_ac_option = \"{every}\"")
    lines += ["", "[compile]", *_compile_lines(setup, "", toml=True).strip().splitlines()]
    return "\n".join(lines) + "\n"


def _py_set(names: list[str]) -> str:
    return "{" + ", ".join(repr(name) for name in names) + "}" if names else "set()"


def _policy_022(checkpointed: list[str]) -> str:
    return f'''The plan exactly (torchtitan 0.2.x): set [activation_checkpoint] mode = "full" and replace
apply_ac in torchtitan/models/llama3/infra/parallelize.py (after its import of apply_ac) with:

from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
CHECKPOINTED = {_py_set(checkpointed)}
def apply_ac(model, ac_config, **kwargs):
    for layer_id, block in list(model.layers.named_children()):
        if f"layers.{{layer_id}}" in CHECKPOINTED:
            model.layers.register_module(layer_id, checkpoint_wrapper(
                block, preserve_rng_state=ac_config.preserve_rng_state))'''
