"""torchtitan's chunked cross-entropy (components/loss.py ChunkedLossWrapper 567-836, torchtitan 0.3.0 =
b5bcd76c; docs/framework-facts.md §57): the model's forward stops at the final norm (models/common/decoder.py
245 `_skip_lm_head`), and the loss splits the norm's output [B, L, D] along the sequence into N chunks,
each `.contiguous()` and a detached leaf; per chunk it runs the LM head, the inner loss (the runtime's
plain, vocab-parallel or compiled cross-entropy on that chunk's logits) and that loss's backward at once,
copying the chunk's hidden gradient into an fp32 [B, L, D] buffer (GradAccumulator); after the last chunk
the buffer is cast to bf16 and saved for the decoder's backward (_DecoderOutputGradientBackProp).

Bytes here are beyond what the layers keep (the head layer's kept norm output stands first for the norm's
output the loss is given, then for the bf16 gradient saved in its place), in the moments the loop passes
through; `tests/test_chunked_loss.py` pins them to torch's MemTracker on the installed torchtitan
(scripts/bench_chunked_loss.py). The cost model never imports a framework: the facts are read here.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.runtime_facts import LossRegion

BF16, FP32, INT64 = 2, 4, 8
# fp32 scalars live at the moments below: the running total, the chunk's loss and its sum before the
# division by the global token count (a chunk's loss forward); the total and the last chunk's loss at the end
SCALARS_IN_CHUNK, SCALARS_AT_END = 3 * FP32, 2 * FP32
# torchtitan's plain cross-entropy (its record's `loss`, planner/cost/runtime_titan.py): what the installed
# ChunkedLossWrapper runs on each chunk by default (CrossEntropyLoss, eager)
TITAN_PLAIN_LOSS = LossRegion(kept_x=2.0, peak_x=6.0)


@dataclass(frozen=True)
class ChunkedLossBytes:
    """The chunked loss's bytes beyond the layers' kept (the module's docstring)."""

    peak_bytes: int  # the most at once while the loss runs
    kept_bytes: int  # from the loss to the decoder's backward: the loss value (the bf16 gradient replaces the norm's
    # output), and beside a pipeline the stage's output the schedule keeps (setup_loss_bytes)
    largest_tensor_bytes: int  # its largest tensor (the allocator's block rounding reads it)


def chunked_loss_bytes(*, batch: int, seq: int, hidden: int, vocab: int, chunks: int,
                       inner: LossRegion = TITAN_PLAIN_LOSS,
                       fsdp_fp32_grad: bool = False) -> ChunkedLossBytes:
    """The loss over `batch` x `seq` tokens (the rank's), `hidden` wide, `vocab` logits a rank computes
    (V/TP under loss parallel), in `chunks` chunks, `inner` the runtime's loss region on a chunk's logits
    (measured with its bf16 logits deleted before its backward; the loop holds them: one more).
    `fsdp_fp32_grad`: the LM head is FSDP2-sharded with an fp32 reduce dtype (torch 2.13
    _fsdp_param_group.py 588-628 and _fsdp_param.py 802-821: with gradient sync off for chunks 0..N-2, post-backward upcasts the unsharded
    gradient to fp32 and keeps it, adding each chunk's bf16 gradient into it; the last chunk's
    reduce-scatter copies it into its fp32 input, _fsdp_collectives.py 597)."""
    hidden_bytes = batch * seq * hidden * BF16
    chunk_logits = batch * (seq // chunks) * vocab * BF16
    # torch.split along the sequence is a view; .contiguous() copies unless each chunk already is one
    # (one chunk, or a batch of one sequence)
    copied = batch > 1 and chunks > 1
    copies = (hidden_bytes + batch * seq * INT64) if copied else 0  # the hidden chunks and the label chunks
    accumulator = batch * seq * hidden * FP32  # GradAccumulator(dtype=torch.float32): torch.zeros_like
    head_grad = vocab * hidden * BF16  # a chunk's new LM-head weight gradient, before it is added in
    kept_head_grad = 2 * head_grad if fsdp_fp32_grad else 0
    held = copies + accumulator + kept_head_grad
    moments = [
        # the inner loss's peak on the chunk's logits, which the loop's `logits` still holds
        held + (inner.peak_x + 1) * chunk_logits + SCALARS_IN_CHUNK,
        # the LM head's backward: its logits, their bf16 gradient, the chunk's hidden gradient, the new weight gradient
        held + 2 * chunk_logits + hidden_bytes // chunks + head_grad + SCALARS_IN_CHUNK,
        # after the loop: the fp32 buffer cast to bf16 beside it, the last chunk's logits still referenced
        held + hidden_bytes + chunk_logits + SCALARS_AT_END,
    ]
    if fsdp_fp32_grad:  # the last chunk's reduce-scatter: its fp32 input beside the kept fp32 gradient
        moments.append(held + 2 * head_grad + chunk_logits + hidden_bytes // chunks + SCALARS_IN_CHUNK)
    largest = max(accumulator, int(FP32 * chunk_logits // BF16), 2 * head_grad if fsdp_fp32_grad else 0)
    return ChunkedLossBytes(peak_bytes=int(round(max(moments))), kept_bytes=FP32, largest_tensor_bytes=largest)


def chunked_extra_bytes_moved(*, batch: int, seq: int, hidden: int, chunks: int) -> int:
    """The bytes the chunked loss moves beyond the plain loss's (its LM head and cross-entropy run the
    same FLOPs and bytes over the chunks): the chunk copies (read and write, where copied), the fp32
    buffer's zero fill, each chunk's hidden gradient cast to fp32 and copied in (read 2, write 4, read 4,
    write 4 a bf16 element), and the buffer's cast to bf16 (read 4, write 2)."""
    elements = batch * seq * hidden
    copies = 2 * BF16 * elements if batch > 1 and chunks > 1 else 0
    return copies + FP32 * elements + (BF16 + 3 * FP32) * elements + (FP32 + BF16) * elements


def _fsdp_fp32_grad(setup) -> bool:
    """The LM head FSDP2-sharded (ZeRO 3) with its gradients reduced in fp32 from bf16 weights, and not
    already kept whole through the microbatches (beside a pipeline that gradient is charged as the
    stage's whole gradients: dataparallel.kept_whole)."""
    from planner.cost import dataparallel

    held = dataparallel.param_bytes(setup)
    return (setup.data_parallel.zero == 3 and dataparallel.shard_size(setup) > 1
            and not dataparallel.kept_whole(setup) and held.grads == FP32 and held.weights == BF16)


def _dims(profile) -> dict[str, int]:
    known = profile.assumptions
    return dict(batch=known["micro_batch_size"], seq=known["seq_len"] // known.get("cp", 1),
                hidden=known["model"]["hidden_size"])


def setup_loss_bytes(profile, setup, inner: LossRegion) -> ChunkedLossBytes | None:
    """The chunked loss of an analytic bf16 profile under `setup` (its --chunked-cross-entropy N), `inner`
    the loss region its runtime runs on a chunk (runtimes.loss_region); None where the setup asks for none."""
    chunks = setup.training.chunked_cross_entropy
    if not chunks:
        return None
    dims = _dims(profile)
    found = chunked_loss_bytes(**dims, vocab=profile.assumptions["vocab_per_device"], chunks=chunks, inner=inner,
                               fsdp_fp32_grad=_fsdp_fp32_grad(setup))
    if setup.pipeline.stages == 1:
        return found
    # beside a pipeline the last stage's output, now the norm's [B, L, D] rather than the logits, stays in
    # torch's fwd_cache to the backward (torch 2.13 pipelining/stage.py 913, 966): the trainer's `del pred`
    # frees nothing, and that output is kept beside the bf16 gradient the loss saves
    held = dims["batch"] * dims["seq"] * dims["hidden"] * BF16
    return ChunkedLossBytes(peak_bytes=found.peak_bytes, kept_bytes=found.kept_bytes + held,
                            largest_tensor_bytes=found.largest_tensor_bytes)


def setup_extra_ms(profile, setup) -> float:
    """chunked_extra_bytes_moved of the profile's microbatch under the setup, in ms at the rate the
    profile records for eager memory-bound kernels (its GPU's HBM bandwidth where it records none);
    0 without chunks."""
    chunks = setup.training.chunked_cross_entropy
    if not chunks:
        return 0.0
    known = profile.assumptions
    tbps = (known.get("membound_tbps") or {}).get("eager") or known["gpu_hbm_tbps"]
    return chunked_extra_bytes_moved(**_dims(profile), chunks=chunks) / (tbps * 1e12) * 1e3


def chunked_head_profile(profile, setup):
    """The profile as the chunked loss runs it (the setup's --chunked-cross-entropy N; else the profile
    itself): the head layer's backward, in the decoder's backward, is the final norm's alone (the LM head's
    ran in the loss), so its scratch is the norm's input gradient, the layer's input bytes, where the
    whole logits' gradient was. Its times are left as they are (the LM head's FLOPs are the same, run
    in the last stage's forward action rather than its backward: docs/published-runs.md §18.chunkce).
    Refuses, in one sentence, a profile whose loss was measured or is not bf16 (the chunked loss is a
    formula over an analytic profile's dimensions)."""
    from planner.errors import UserError

    chunks = setup.training.chunked_cross_entropy
    if not chunks:
        return profile
    if profile.source != "analytic" or profile.dtype != "bfloat16":
        raise UserError(f"chunked cross-entropy (--chunked-cross-entropy {chunks}) is scored on an analytic bf16 "
                        f"profile (`ckplan profile --arch ...`); this one is {profile.source}, {profile.dtype}, its "
                        "loss measured whole")
    tokens = profile.assumptions["seq_len"] // profile.assumptions.get("cp", 1)
    if tokens % chunks:  # ChunkedLossWrapper's torch._check (loss.py 671-674)
        raise UserError(f"chunked cross-entropy splits each sequence's {tokens} tokens (a rank's) into {chunks} "
                        f"equal chunks, and {chunks} does not divide {tokens}: torchtitan refuses it")
    *body, head = profile.layers
    return profile.model_copy(update={"layers": [*body, head.model_copy(update={"transient_bytes": head.input_bytes})]})


def head_grads_reduced_in_loss(profile, setup) -> tuple[float, float]:
    """What FSDP2's per-moment units (fsdpunits.layer_moment_bytes) charge at the head layer's backward for the
    LM head's gradient, which the chunked loss already reduced on its last chunk: (while the norm's backward
    computes: the head's unsharded bf16 gradient; in the unit's post-backward: that and its reduce-scatter
    input in the reduce dtype). In the decoder's backward the [norm, lm_head] unit is gathered again for the
    norm's backward (its pre-backward unshards the group), but post_backward finds no gradient on the LM head
    (torch 2.13 _fsdp_param_group.py 618-628: neither an accumulated nor an unsharded one), so only the norm's
    is reduced. (0, 0) without chunks."""
    from planner.cost import dataparallel

    if not setup.training.chunked_cross_entropy:
        return 0.0, 0.0
    head = profile.assumptions["vocab_per_device"] * profile.assumptions["model"]["hidden_size"]
    held = dataparallel.param_bytes(setup)
    return head * held.weights, head * (held.weights + held.grads)
