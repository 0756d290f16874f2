"""The configs users already have, read into one record ckplan can score: a Megatron-LM launch
script or YAML of its arguments (megatron.py), a torchtitan job TOML (torchtitan.py).

Every flag or key a reader meets is accounted for in `Job.settings`, one of:
  modelled      the prediction includes it;
  not modelled  it changes memory or time and the prediction leaves it out (said, with what it is);
  no effect     it changes neither (logging, paths, learning rate, data): recognised, listed;
  unknown       the reader does not know it: listed, never dropped.
Nothing read is run: the readers parse text (bashargs.py, tomllib, yaml.safe_load).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from planner.models.archs import Arch

Status = Literal["modelled", "not modelled", "no effect", "unknown"]

# The settings real jobs use that the cost model does not model (planner/cost/runtimes.py
# refused_settings, or not in TrainingSetup at all): a reader maps each framework flag that asks for
# one to its key here, and the flag is reported "not modelled" with this sentence (the config is still
# scored, without it). The settings it does model are the reader's `Job.modelled` (JobSettings).
PENDING: dict[str, str] = {
    "float8": "Float8 matmuls (torchao / Transformer Engine): faster matmuls, about the same memory",
    "mx": "MX (microscaling) matmuls or quantized grouped matmuls (torchao): scored in bf16",
    "lora": "LoRA adapters (torchtitan components/lora.py at b5bcd76c): the base weights frozen, so neither their "
            "gradients nor their optimizer state exist: scored as full training of every weight (memory and the "
            "weight-gradient matmuls over-counted), the adapters' own matmuls left out",
    "cp": "context parallelism's hierarchical all-to-all and ring (a2a+p2p, hierarchical sizes, a type per layer): "
          "scored as the p2p ring",
    "cp-unbalanced": "context parallelism without the load balancer (the last rank computes the most): scored "
                     "balanced",
    "bf16-optimizer-states": "master weights or gradients below fp32, or moments in fp16/fp8 (precision-aware "
                             "optimizer): only bf16 moments (--exp-avg-dtype and --exp-avg-sq-dtype bf16) are modelled",
    "chunked-ce": "a fused or chunked cross-entropy (a smaller loss region)",
    "etp": "an expert tensor-parallel size other than TP (experts split over another group)",
    "fp8-all-gather": "fp8 weights in the data-parallel all-gather (less traffic and gathered bytes)",
    "bf16-grad-reduce": "gradients reduced (and bucketed) in bf16 rather than fp32",
    "op-sac": "op-level selective activation checkpointing, which ckplan offers only for LLaMA-style blocks with "
              "flash attention and no shared-expert gate (planner/profiler/opsac.py): scored as no recompute",
}


@dataclass
class JobSettings:
    """The settings real jobs use that the file asks for and the cost model models: passed to the
    setup as TrainingSettings (planner/commands/training_settings.py) and --tp-overlap."""

    compile: bool = False  # torch.compile of the layers (their kept bytes as the profile records them compiled)
    compile_loss: bool | None = None  # the loss compiled (None: with the layers, as the runtime's version does)
    op_level_sac: bool = False  # checkpointed blocks run torchtitan's op-level policy (op-sac)
    optimizer_state_dtype: Literal["fp32", "bf16"] = "fp32"  # Adam's moments
    expert_tp: int | None = None  # the expert tensor-parallel size where the file gives it (= TP)
    tp_overlap: Literal["none", "async-tp", "tp-comm-overlap"] = "none"
    ub_cfg: str | None = None  # Megatron-Bridge's userbuffers config name, or the file read (cost/ub_sms.py CONFIGS)
    ub_gemms: dict | None = None  # the file's, per GEMM: method, num_sm, set_sm_margin, use_ce (ub_cfg.py)
    cp_comm: Literal["p2p", "allgather", "a2a"] | None = None  # context parallelism's K/V exchange (None: the runtime's)
    float8: bool = False  # Float8 linears (torchtitan's float8 converter; Megatron-LM's --fp8-format)
    fp8_all_gather: bool = False  # FSDP2's float8 all-gather of their weights (torchtitan)
    # Megatron-LM's --no-gradient-accumulation-fusion, --log-params-norm, --log-num-zeros-in-grad (time)
    unfused_grad_accumulation: bool = False
    log_params_norm: bool = False
    log_num_zeros_in_grad: bool = False
    timing_log_level: int = 0  # Megatron-LM's --timing-log-level (its timers' synchronizes)
    test_mode: bool = False  # Megatron-LM's --test-mode (the attention's realtime q/k norm checks)
    deterministic: bool = False  # Megatron-LM's --deterministic-mode (its NaN fill; attention not charged)
    grad_reduce_bf16: bool = False  # Megatron-LM's --grad-reduce-in-bf16
    te_cross_entropy: bool = False  # Megatron-LM's --cross-entropy-loss-fusion --cross-entropy-fusion-impl te
    local_layers: bool = False  # Megatron-LM's --transformer-impl local (Megatron-core's local spec)
    fused_cross_entropy: bool = False  # Megatron-LM's --cross-entropy-loss-fusion, native (its own, compiled)
    te_grouped_gemm: bool = False  # Megatron-LM's --moe-grouped-gemm on Transformer Engine's layers
    nccl_ring_simple: bool = False  # the launch forces NCCL_ALGO=Ring, NCCL_PROTO=simple (the functional tests')
    fp8_current_scaling: bool = False  # Megatron-LM's --fp8-recipe tensorwise under --fp8-format (TE's current scaling)
    fp8_delayed_scaling: bool = False  # Megatron-LM's --fp8-recipe delayed (its default) under --fp8-format
    fp8_amax_history_len: int = 1  # Megatron-LM's --fp8-amax-history-len (its default 1)
    fp8_amax_tp_only: bool = False  # Megatron-LM's --tp-only-amax-red
    nccl_nvls_off: bool = False  # the launch sets NCCL_NVLS_ENABLE=0 (Bridge's executor, the functional tests')
    # the launch's PYTORCH_CUDA_ALLOC_CONF expandable_segments (a functional test's ENV_VARS); None: not said
    expandable_segments: bool | None = None
    # Megatron-LM's DDP overlap, as DataParallelSetup's fields (overlap_grad_reduce, overlap_param_gather,
    # bucket_params, align_grad_reduce, align_param_gather, param_gather_with_step); empty: the runtime's defaults
    ddp: dict = field(default_factory=dict)
    chunked_cross_entropy: int | None = None  # torchtitan's ChunkedLossWrapper: its num_chunks (None: whole logits)
    # the runtime's version whose record applies (planner/cost/runtimes.py VERSIONS) where the file
    # dates itself; None: the newest read (Job.notes says which and why)
    runtime_version: str | None = None
    # DeepSpeed's engine (Megatron-DeepSpeed's --deepspeed, planner/models/configs/megatron_deepspeed.py): the
    # ds_config's optimizer offload, and its stage3 knobs as DataParallelSetup's stage3_* fields
    offload_optimizer: bool = False
    deepspeed: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Setting:
    """One flag or key as the file gives it, and what the prediction makes of it."""

    name: str  # the flag (--hidden-size) or key (parallelism.tensor_parallel_degree)
    value: str
    status: Status
    what: str  # what it is / what the prediction does with it


@dataclass
class Recompute:
    """Which decoder layers recompute, as the framework says it."""

    mode: Literal["none", "full", "block", "every", "selective", "op"] = "none"  # op: every block, op-level SAC
    num_layers: int = 0  # block: the first N of each (virtual) stage; every: every Nth a rank builds
    option: str = "full"  # selective: ckplan's per-layer option (planner/runtime/recompute.py)
    # selective under Megatron-LM: its --recompute-modules, which give dense and MoE layers different parts;
    # each layer takes the parts its profile offers (megatron_flags.layer_option). Empty: `option` everywhere
    modules: tuple[str, ...] = ()


@dataclass
class Job:
    """A training job as a framework's config describes it, in ckplan's terms."""

    framework: Literal["megatron", "torchtitan"]
    source: str  # the file, as given
    arch: Arch
    seq_len: int
    micro_batch_size: int
    attention: Literal["flash", "eager"] = "flash"  # eager: the s x s scores kept (an unfused kernel)
    vocab_unpadded: int | None = None  # Megatron-LM: --vocab-size before its padding to a multiple of TP x 128
    global_batch_size: int | None = None  # sequences per iteration over all data-parallel ranks
    local_batch_size: int | None = None  # torchtitan: sequences per data-parallel rank per step
    tp: int = 1
    sp: bool = False
    pp: int = 1
    chunks: int = 1  # virtual stages per pipeline rank
    layers_per_stage: list[int] | None = None  # decoder layers of each of the pp * chunks stages
    cp: int = 1
    ep: int = 1
    mtp_layers: int = 0  # Megatron-core's multi-token-prediction layers (--mtp-num-layers), on the last stage
    ep_backend: tuple[str, int] | None = None  # Megatron's flex dispatcher on DeepEP / HybridEP: (backend, SMs)
    dp_given: int | None = None  # a data-parallel degree the file states (-1 / None: the rest of the GPUs)
    dp_replicate: int = 1  # torchtitan: HSDP replicas (FSDP2 shards over the dp / replicate others)
    world_size: int | None = None  # GPUs the launcher line starts (torchrun's --nproc_per_node x --nnodes)
    schedule: str = "1F1B"
    zero: int = 0
    zero_gather: Literal["per-microbatch", "per-iteration"] = "per-microbatch"
    precision: Literal["fp32", "bf16", "bf16-mixed", "fp16-mixed"] = "bf16-mixed"
    optimizer: Literal["adam", "sgd"] = "adam"
    recompute: Recompute = field(default_factory=Recompute)
    modelled: JobSettings = field(default_factory=JobSettings)
    settings: list[Setting] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    runtime: str | None = None  # the runtime scored where not the framework's own (Megatron-DeepSpeed: "deepspeed")

    def said(self, name: str, value: object, status: Status, what: str) -> None:
        self.settings.append(Setting(name=name, value=_text(value), status=status, what=what))

    def of(self, status: Status) -> list[Setting]:
        return [s for s in self.settings if s.status == status]


def pending(key: str) -> str:
    """The sentence for a setting the cost model does not model (PENDING)."""
    return PENDING[key]


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return " ".join(_text(v) for v in value)
    return str(value).replace("\x00", "")  # a never-run $(command) marker (bashargs.COMMAND_MARK) shown as written
