"""Configurations the frameworks publish, as data with their source: what `ckplan search
--compare` scores beside its own under the same cost model. Exact settings and sources are
those docs/published-runs.md gathered (its row is named in each `source`); a recipe that
gives no GPU count (Megatron-LM's examples) is run at the GPUs asked, its data parallelism
taking the rest.

A hand configuration (`search --tp --pp --dp ...`) is the same record. Readers of a framework's
own files (`--from-megatron ARGS`, `--from-torchtitan TOML`, issue 33) return one too: they
plug in through `Published` alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Recompute = Literal["full", "none", "plan"]  # whole layers, nothing, or ckplan's plan for these degrees


@dataclass(frozen=True)
class Published:
    """One configuration as a framework runs it. `layers_per_stage`: decoder layers of each
    pipeline stage (all chunks of all ranks in pipeline order; the embedding joins the first and
    the head the last, as torchtitan and Megatron-LM count); None: as even as the layers allow."""

    name: str
    arch: str  # planner/models/archs.py name
    framework: Literal["torchtitan", "megatron", "colossalai", "hand"]
    gpus: int | None  # None: the recipe gives none; data parallelism takes what the job has
    gpu: str
    seq_len: int
    global_batch: int  # sequences per iteration as published; 0: the source gives none
    micro_batch_size: int
    tp: int = 1
    sp: bool = False
    pp: int = 1
    schedule: str = "1F1B"
    chunks: int = 1
    zero: int = 0
    shard_group: int | None = None
    ep: int = 1
    cp: int = 1  # context parallel: each sequence over cp ranks (Megatron-LM's --context-parallel-size, torchtitan's
    #              parallelism.context_parallel_degree), data parallelism taking what tp x cp x pp leaves
    recompute: Recompute = "full"
    layers_per_stage: tuple[int, ...] | None = None
    ckpt_per_stage: tuple[int, ...] | None = None  # checkpointed decoder layers per stage (first k)
    # the checkpointed blocks under torchtitan's op-level policy (a torchtitan file's selective_ac_option op),
    # scored so where the search is given --op-level-sac
    op_level_sac: bool = False
    # a framework file's own settings, scored with it as `evaluate --from-*` scores them: Megatron-LM's DDP
    # (DataParallelSetup's fields: overlap_grad_reduce, overlap_param_gather, bucket_params, ...) and TE's userbuffers
    # config under --tp-comm-overlap (its name; a --tp-comm-overlap-cfg file's GEMMs)
    ddp: tuple[tuple[str, object], ...] = ()
    # the file's own model where it is the searched one with its vocabulary padded as Megatron-LM pads it (a multiple
    # of --make-vocab-size-divisible-by x TP): profiled as the file's, as evaluate profiles it; None: the searched one
    model: object = None  # archs.Arch
    ub_cfg: str | None = None
    ub_gemms: dict | None = None
    not_expressible: str = ""  # what the framework runs that ckplan's cost model does not charge
    source: str = ""


_TT = "torchtitan benchmarks/llama3_h100_202412_torchtitan.md (torchtitan 9dec370)"
_TT_ASYNC = "torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (torchtitan 820504e)"
_OP_SAC = "op-level SAC (scored as full recompute), torch.compile"

PUBLISHED: tuple[Published, ...] = (
    Published("torchtitan 8B FSDP 8", "llama3-8b", "torchtitan", 8, "h100", 8192, 16, 2, zero=3,
              not_expressible=_OP_SAC, source=f"{_TT}, Table 1 'FSDP'; docs/published-runs.md M8"),
    Published("torchtitan 8B FSDP 128", "llama3-8b", "torchtitan", 128, "h100", 8192, 256, 2, zero=3,
              not_expressible=_OP_SAC, source=f"{_TT}, Table 3; docs/published-runs.md M10"),
    Published("torchtitan 8B FSDP 8 x TP 8", "llama3-8b", "torchtitan", 64, "h100", 8192, 96, 12, tp=8, sp=True,
              zero=3, not_expressible=_OP_SAC, source=f"{_TT_ASYNC}, 8B table, vanilla TP; docs/published-runs.md T11"),
    Published("torchtitan 70B FSDP 32 x TP 8", "llama3-70b", "torchtitan", 256, "h100", 8192, 512, 16, tp=8, sp=True,
              zero=3, not_expressible="torch.compile, Float8",
              source=f"{_TT}, Table 4 '2D'; docs/published-runs.md M15"),
    Published("torchtitan 405B 1F1B", "llama3.1-405b", "torchtitan", 512, "h100", 8192, 256, 4, tp=8, sp=True,
              pp=8, zero=3, layers_per_stage=(15, 16, 16, 16, 16, 16, 16, 15),
              not_expressible="torch.compile, Float8, AsyncTP",
              source=f"{_TT}, Table 5 '1F1B' (8 microbatches of 4, torchtitan's default microbatches = pp); "
                     "docs/published-runs.md M17"),
    Published("torchtitan 405B interleaved", "llama3.1-405b", "torchtitan", 512, "h100", 8192, 256, 4, tp=8, sp=True,
              pp=8, schedule="interleaved-1F1B", chunks=2, zero=3,
              layers_per_stage=(7,) + (8,) * 14 + (7,), not_expressible="torch.compile, Float8, AsyncTP",
              source=f"{_TT}, Table 5 'Interleaved 1F1B'; docs/published-runs.md M18"),
    Published("Megatron GPT-3 175B", "gpt3-175b", "megatron", None, "a100-80g", 2048, 1536, 1, tp=8, pp=16,
              zero=0, recompute="none", not_expressible="fp16 (scored at the search's --precision; fp16-mixed scores it as run)",
              source="Megatron-LM examples/gpt3/train_gpt3_175b_distributed.sh (157006d6): TP 8, PP 16, MBS 1, "
                     "GBS 1536, seq 2048, no --use-distributed-optimizer (ZeRO 0), no recompute flag; no GPU "
                     "count (NUM_NODES a placeholder)"),
    Published("Megatron Mixtral 8x7B", "mixtral-8x7b", "megatron", None, "h100", 4096, 256, 1, pp=4,
              schedule="interleaved-1F1B", chunks=8, zero=1, ep=8, recompute="none",
              not_expressible="grouped GEMM, the all-to-all overlap",
              source="Megatron-LM tests mixtral/mixtral_8x7b_tp1pp4ep8vpp8_release (93ebf8d7): TP 1, PP 4, "
                     "VPP 8, EP 8, GBS 256 as its name and docs/published-runs.md §4 give them; MBS 1, ZeRO 1 "
                     "(distributed optimizer) and no recompute assumed: the release recipe's flags are not public"),
    Published("ColossalAI 70B hand", "llama3-70b", "colossalai", 32, "h100", 8192, 16, 1, tp=8, sp=True, pp=4,
              layers_per_stage=(19, 20, 20, 21), ckpt_per_stage=(19, 19, 19, 13),
              source="ColossalAI's hand configuration for LLaMA3-70B on pp 4 (TP 8 + SP, 16 microbatches of 1), "
                     "as docs/exports.md scores it"),
)


def published_for(arch: str) -> list[Published]:
    """The published configurations of one architecture."""
    return [p for p in PUBLISHED if p.arch == arch]
