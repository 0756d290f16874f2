"""The figures users hold ckplan against: tokens per second per GPU and model-FLOPs utilisation,
computed from a predicted iteration the way the frameworks log them from a measured one. Both
count model FLOPs (forward and backward, never the recompute), so they are outputs of the time
model, not inputs to it (`--mfu` on `ckplan profile` is a separate, explicit override).

torchtitan (torchtitan/components/metrics.py, torchtitan 76dd118): tps = the rank's tokens /
(step time x the non-data-parallel degrees), i.e. the job's tokens / (time x GPUs); mfu = 100 x
flops_per_token x tps / the GPU's BF16 peak, where flops_per_token = 6 x (parameters - the
embedding's) + 12 x layers x heads x head_dim x seq_len (torchtitan/models/utils.py
get_dense_model_nparams_and_flops; MoE: the active parameters, every token's top-k routed experts
and the shared ones). The attention term is the non-causal count.

Megatron-LM (megatron/training/training.py num_floating_point_operations, Megatron-LM 001b00c2):
throughput per GPU (TFLOP/s/GPU) = FLOPs of the batch / (iteration time x world size), FLOPs =
3 (forward, wgrad, dgrad) x 2 x tokens x [per layer: hidden x (q + k + v widths) + q width x
seq_len / 2 x 2 (causal: half the scores) + q width x hidden, the MLP's hidden x ffn x (3 gated,
2 not), a MoE layer's top-k routed and shared experts' likewise] + the logits' hidden x vocab.
No recompute term (full recompute's extra forward is not counted).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.models.archs import Arch

TORCHTITAN_SOURCE = ("torchtitan 76dd118 torchtitan/components/metrics.py (tps, mfu) and torchtitan/models/utils.py "
                     "(6 x non-embedding parameters + 12 x l x h x q x s per token)")
MEGATRON_SOURCE = ("Megatron-LM 001b00c2 megatron/training/training.py num_floating_point_operations (causal "
                   "attention halved, no recompute) / (iteration time x world size)")


@dataclass(frozen=True)
class Throughput:
    """One iteration's figures: per GPU, as the frameworks log them."""

    tokens_per_s_per_gpu: float
    torchtitan_mfu: float | None  # fraction of the BF16 peak; None: the model's dimensions are not known
    megatron_tflops_per_gpu: float | None
    megatron_mfu: float | None
    gpus: int

    def as_dict(self) -> dict:
        return {"tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "mfu_torchtitan": self.torchtitan_mfu,
                "tflops_per_gpu_megatron": self.megatron_tflops_per_gpu, "mfu_megatron": self.megatron_mfu,
                "gpus": self.gpus, "sources": [TORCHTITAN_SOURCE, MEGATRON_SOURCE]}


def _routed_active(arch: Arch) -> tuple[int, int]:
    """(parameters of one layer's routed experts, of the top-k a token reaches), GPT-OSS's expert biases with
    them (torchtitan b5bcd76c get_moe_model_nparams_and_flops counts every `moe.routed_experts` parameter)."""
    from planner.profiler.formulas import Shape, expert_width_params

    one = expert_width_params(arch, Shape(seq_len=1, micro_batch_size=1))
    return arch.num_experts * one, arch.num_experts_per_tok * one


def total_params(arch: Arch) -> tuple[int, int]:
    """(active parameters, the embedding's), the model whole (no tensor parallelism): a MoE
    layer counts its top-k routed experts."""
    from planner.profiler.formulas import Shape, block_params, embedding_params, head_params

    whole = Shape(seq_len=1, micro_batch_size=1)
    blocks = 0
    for index in range(arch.num_layers):
        moe = arch.is_moe_layer(index)
        blocks += block_params(arch, whole, moe=moe)
        if moe:
            routed, active = _routed_active(arch)
            blocks -= routed - active
    embedding = embedding_params(arch, whole)
    head = head_params(arch, whole) if not arch.tie_word_embeddings else arch.hidden_size
    return embedding + blocks + head, embedding


def torchtitan_flops_per_token(arch: Arch, seq_len: int) -> float:
    params, embedding = total_params(arch)
    return 6 * (params - embedding) + 12 * arch.num_layers * arch.num_heads * arch.head_size * seq_len


def megatron_flops_per_token(arch: Arch, seq_len: int) -> float:
    """Megatron-LM's count for a GQA (or MHA) model; latent attention by its q/k/v widths."""
    h = arch.hidden_size
    q = arch.num_heads * arch.head_size
    kv = arch.num_kv_heads * arch.head_size
    gated = 3 if arch.style == "llama" else 2
    attention = h * (q + 2 * kv) + q * seq_len / 2 * 2 + q * h
    mlp = 0.0
    for index in range(arch.num_layers):
        if arch.is_moe_layer(index):
            mlp += h * gated * (arch.moe_intermediate_size * arch.num_experts_per_tok
                                + arch.num_shared_experts * arch.shared_intermediate_size)
        else:
            mlp += h * gated * arch.intermediate_size
    return 3 * 2 * (arch.num_layers * attention + mlp + h * arch.vocab_size)


def throughput(*, iteration_ms: float, tokens_per_iteration: int, gpus: int, peak_tflops: float,
               arch: Arch | None, seq_len: int) -> Throughput:
    """The figures for one iteration of `tokens_per_iteration` tokens (the whole job's) on `gpus`
    GPUs of `peak_tflops` BF16 peak."""
    seconds = iteration_ms / 1e3
    tps = tokens_per_iteration / (seconds * gpus) if seconds > 0 else 0.0
    if arch is None:
        return Throughput(tps, None, None, None, gpus)
    titan = torchtitan_flops_per_token(arch, seq_len) * tps / (peak_tflops * 1e12)
    megatron_tflops = megatron_flops_per_token(arch, seq_len) * tps / 1e12
    return Throughput(tps, titan, megatron_tflops, megatron_tflops / peak_tflops, gpus)


def profile_arch(assumptions: dict) -> Arch | None:
    """The architecture an analytic profile recorded (its dimensions), None for other profiles."""
    model = assumptions.get("model")
    if not isinstance(model, dict):
        return None
    fields = {key: tuple(value) if isinstance(value, list) else value for key, value in model.items()}
    try:
        return Arch(name=str(assumptions.get("arch", "")), **fields)
    except TypeError:
        return None
