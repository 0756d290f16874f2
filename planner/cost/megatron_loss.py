"""The runtime's own unfused cross-entropy, in place of the profile's eager loss (issue 35: the Megatron-LM
functional tests T15-T20; docs/framework-facts.md §77).

The analytic profile times the loss as an eager Hugging Face / torchtitan cross-entropy moves it (planner/
profiler/analytic.py loss_ms: the cast to fp32, log_softmax, nll_loss's zero-filled gradient, log_softmax's
backward, the cast back: 2d + 32 B a logit). Megatron-LM without --cross-entropy-loss-fusion runs its own
vocab-parallel cross-entropy (megatron/core/tensor_parallel/cross_entropy.py, Megatron-LM 6e091e1b; the same
code at any TP, the statistics all-reduced per token), an autograd.Function whose ops each pass over every logit
of the device (N of them, bf16 in):

    forward   logits.float()                     read 2, write 4    (calculate_logits_max)
              torch.max(dim=-1)                  read 4
              logits -= max                      read 4, write 4    (calculate_predicted_logits, in place)
              torch.exp(logits, out=logits)      read 4, write 4
              exp.sum(dim=-1)                    read 4
              exp.div_(sum)                      read 4, write 4    (calculate_cross_entropy_loss: the softmax saved)
    backward  grad_2d[arange, target] -= 1       a token each       (calculate_gradients)
              grad.mul_(grad_output)             read 4, write 4
              the fp32 gradient cast to the      read 4, write 2    (autograd's engine casts a Function's gradient
              logits' bf16                                           to its input's dtype)

52 B a bf16 logit (the record's `vocab_parallel_ce_bytes`), against the profile's 36. Under deterministic mode
the two casts allocate their outputs through aten::empty_strided (_to_copy), which torch.use_deterministic_
algorithms fills with NaN first (TensorFactories.cu empty_strided_cuda, fill_uninitialized_memory): 4 + 2 B more
(the record's `ce_fill_bytes`, written at the HBM bandwidth as jobsettings' fills are; tests/test_megatron_loss.py
watches torch 2.13 make those two fills and no other of the logits' size).

The chain is timed whole where it is published: Liger-Kernel's benchmark calls megatron-core's own
vocab_parallel_cross_entropy (and the fused one) on bf16 logits on an H100 SXM (planner/models/
membound_published.py MEGATRON_CE_H100: 52 B a logit at 0.788 of the HBM bandwidth, the fused 40 at 0.693; the GPU
record's `megatron_ce_efficiency`). Its ops are casts, elementwise ops and row reductions, each one pass over its
bytes, not torch's log_softmax and nll_loss, whose sweep sets the `loss` class rate (0.391 on the H100): charged at
that class, the chain took twice its published time. Where the GPU has no such figure the chain's bytes run at the
profile's `loss` class rate, as the profile's own loss (planner/profiler/membound.py). The term is the chain's time
less the profile's own loss (loss_bytes_per_logit, 36 B at bf16, at the `loss` class rate), plus the fills. Only where the profile's loss is the formula (an analytic bf16 profile: rules.runtime_loss) and
the runtime runs its own loss (or Transformer Engine's, below): not a chunked or compiled loss. Each MTP head's
loss counts as the model's (losses).

Under --cross-entropy-loss-fusion (the native implementation, TrainingSetup.fused_cross_entropy) Megatron-LM runs
the same ops in four torch.compile'd steps (megatron/core/fusions/fused_cross_entropy.py; megatron/core/jit.py:
jit_fuser is torch.compile on torch >= 2.2), one kernel each as torch 2.13's inductor writes them
(tests/test_megatron_fused_ce.py):

    forward   the cast to fp32 and the max          read 2, write 4
              subtract, exp (into the copy), sum    read 4, write 4
              divide (the softmax saved)            read 4, write 4
    backward  index_put's copy of the softmax,      read 4, write 4, read 4, write 4 + 2
              the multiply into it, the bf16 cast

40 B a logit (the record's `fused_ce_bytes`); the fills are not charged there (inductor's own buffers, not
aten::empty's: not read).

Under --cross-entropy-fusion-impl te (TrainingSetup.te_cross_entropy: every Megatron-Bridge recipe) megatron-core
92c8482e calls Transformer Engine's parallel_cross_entropy on the bf16 vocab-parallel logits as the output layer
made them (language_module.py 128-171, reduce_loss False: a loss a token), whose Triton kernels at TE v2.9
(70f53666, the version Megatron-Bridge 25.11 pins; transformer_engine/pytorch/triton/cross_entropy.py) each pass
over every logit in the logits' own bf16:

    forward   online_softmax_kernel: max and sum of exps   read 2                 (72; per token m, d, x_y stored)
              [TP > 1: all_gather_into_tensor of m, d, x_y, 3 fp32 a token, over the TP group (316)]
              cross_entropy_kernel: the gradient           read 2, write 2        (174, 187: into the logits)
    backward  element_mul_kernel: times grad_output        read 2, write 2        (262-263, in place; run since
                                                                                   Megatron's grad_output is a
                                                                                   tensor a token, 352-369)

and CrossEntropyFunction.backward hands the logits' own storage back as their bf16 gradient (cross_entropy.py
76-80: no autograd cast). 10 B a logit (the record's `te_ce_bytes`), against the profile's 36: the term is
negative there, the profile's eager loss over-charged. No fills (its only allocations, torch.zeros, are a few
fp32 a token). At TP > 1 the statistics' all-gather is charged as NCCL's ring at the TP link (comm.
collective_ms: 12 B a token on each rank, 12·TP gathered). The memory is the record's te_cross_entropy region
(kept 1x, peak 1x: the gradient in the logits), read by rules.loss_holds_logits and reserve_megatron.
"""

from __future__ import annotations

from planner.cost import runtimes
from planner.cost.comm import collective_ms, tp_link
from planner.cost.rules import compute_ms, loss_compiled, runtime_loss
from planner.errors import UserError
from planner.schema import Profile, TrainSetup

LOGIT_BYTES = 2  # the records' loss bytes are of bf16 logits (runtime_loss reads bf16 profiles only)
TE_STATS_BYTES = 3 * 4  # TE's m, d and x_y a token, fp32 (triton/cross_entropy.py 287, 313-316, TE v2.9)


def _positive(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def _loss_tbps(profile: Profile) -> float | None:
    """TB/s the profile's loss kernels reach: its measured `loss` class rate, else its eager mean, else the HBM
    bandwidth; None where it names none (a measured profile)."""
    rates = profile.assumptions.get("membound_tbps")
    if isinstance(rates, dict):
        found = _positive((rates.get("by_class") or {}).get("loss", rates.get("eager")))
        if found:
            return found
    return _positive(profile.assumptions.get("gpu_hbm_tbps"))


def _chain_tbps(profile: Profile, training) -> float | None:
    """TB/s Megatron-LM's own cross-entropy chain (unfused, or its fused one) is published to run at on the
    profile's GPU, for the bytes its record counts (GPU.megatron_ce_efficiency); None for TE's, or where the GPU has
    no such figure."""
    if getattr(training, "te_cross_entropy", False):
        return None
    name = profile.assumptions.get("gpu")
    if not isinstance(name, str):
        return None
    from planner.models import archs

    try:
        gpu = archs.gpu(name)
    except UserError:
        return None
    fraction = dict(gpu.megatron_ce_efficiency).get("fused" if getattr(training, "fused_cross_entropy", False)
                                                    else "unfused")
    return gpu.hbm_tbps * fraction if fraction else None


def te_fused(record: runtimes.RuntimeFacts, training) -> bool:
    """Whether the setup runs Transformer Engine's fused cross-entropy and the record reads it."""
    return bool(getattr(training, "te_cross_entropy", False) and record.te_cross_entropy is not None)


def ce_bytes(record: runtimes.RuntimeFacts, training) -> tuple[int, int]:
    """(bytes a bf16 logit, of which NaN-filled under deterministic mode) of the runtime's own cross-entropy
    the setup runs: Transformer Engine's (te_ce_bytes, no fills), the fused one (fused_ce_bytes; its fills not
    read) or the unfused one."""
    if getattr(training, "te_cross_entropy", False):
        return (record.te_ce_bytes, 0) if te_fused(record, training) else (0, 0)
    if getattr(training, "fused_cross_entropy", False):
        return record.fused_ce_bytes, 0
    return record.vocab_parallel_ce_bytes, record.ce_fill_bytes


def runs_own_ce(profile: Profile, setup: TrainSetup) -> int:
    """The logits a microbatch on the device where the runtime's own cross-entropy (unfused, its own fused one,
    or Transformer Engine's) replaces the profile's loss (the module's docstring), its MTP heads' too, else 0."""
    record, training = runtimes.of(setup.training), setup.training
    if not ce_bytes(record, training)[0] or loss_compiled(training) or training.chunked_cross_entropy:
        return 0
    found = runtime_loss(profile, setup)
    return int(found[0]) // LOGIT_BYTES * losses(profile) if found else 0


def losses(profile: Profile) -> int:
    """The cross-entropies a microbatch runs on the last stage, each over the head's logits: the model's, and
    one a multi-token-prediction head's (analytic_mtp's `mtp_head` layers, whose times carry the profile's eager
    loss: Megatron-core's MTP loss calls the same compute_language_model_loss, gpt_model.py 572-592 beside 666,
    megatron-core 92c8482e)."""
    return 1 + sum(1 for layer in profile.layers if layer.kind == "mtp_head")


def vocab_parallel_ce_ms(profile: Profile, stage: int, setup: TrainSetup) -> float:
    """ms a microbatch the runtime's own cross-entropy takes on the last stage beyond the profile's loss: its
    bytes at the chain's published rate (_chain_tbps; else the profile's loss rate) less the profile's own loss
    at the loss rate, and under deterministic mode its NaN fills at the
    HBM bandwidth (scaled like the layers' compute); 0 on other stages and where it does not run."""
    if stage != setup.pipeline.stages - 1:
        return 0.0
    logits = runs_own_ce(profile, setup)
    rate, hbm = _loss_tbps(profile), _positive(profile.assumptions.get("gpu_hbm_tbps"))
    if not logits or rate is None:
        return 0.0
    profiled = _positive(profile.assumptions.get("loss_bytes_per_logit"))  # the analytic profile's own (loss_ms)
    if profiled is None:
        return 0.0
    record = runtimes.of(setup.training)
    moved, filled = ce_bytes(record, setup.training)
    chain = _chain_tbps(profile, setup.training) or rate
    ms = logits * (moved / (chain * 1e12) - profiled / (rate * 1e12)) * 1e3
    if setup.training.deterministic and filled and hbm:
        ms += logits * filled / (hbm * 1e12) * 1e3
    gather = losses(profile) * te_stats_gather_ms(profile, setup) if te_fused(record, setup.training) else 0.0
    return compute_ms(ms, setup.time) + gather


def te_stats_gather_ms(profile: Profile, setup: TrainSetup) -> float:
    """ms a microbatch TE's cross-entropy spends gathering its statistics over the TP group (the module's
    docstring): NCCL's ring all-gather of TE_STATS_BYTES a token from each of the TP ranks, at the TP link; 0 at
    TP 1, without a TP link, or where the profile names no tokens."""
    tp, link = setup.comm.tp, tp_link(setup.comm)  # the group the profile's collectives run in (comm.pass_comm_ms)
    shape = profile.assumptions
    seq = shape.get("seq_len")
    if tp < 2 or link is None or not isinstance(seq, int) or seq <= 0:
        return 0.0
    cp = shape.get("cp", 1)
    tokens = seq // (cp if isinstance(cp, int) and cp >= 1 else 1) * profile.micro_batch_size
    return collective_ms("all-gather", tokens * TE_STATS_BYTES * tp, tp, link)
