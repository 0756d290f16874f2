"""GB200's memory as a process sees it (docs/published-runs.md §29.b3fit, framework-facts §125): torch's CUDA total
on a GB200 is 184.31 GiB (vllm-project/vllm#43951), not the 186 GB sold less H100's reservation (172.8 GiB) ckplan
took before, which put the Megatron-Bridge GB200 rows B3 and B6, jobs that ran, over ckplan's cap."""

from __future__ import annotations

import json

from fixtures.cli import run

from planner.models.gpus import CUDA_CONTEXT_BYTES, gpu

MIB, GIB = 2**20, 2**30
TINY = ["--num-layers: 2", "--hidden-size: 256", "--num-attention-heads: 8", "--seq-length: 128",
        "--vocab-size: 1024", "--bf16: true", "--micro-batch-size: 1", "--global-batch-size: 1"]


def test_gb200s_cuda_total_is_torchs_reading_and_agrees_with_nvidia_smi_as_b200s_pair_does():
    card = gpu("gb200")
    assert card.cuda_total_bytes == int(184.31 * GIB)
    assert card.usable_bytes == card.cuda_total_bytes - CUDA_CONTEXT_BYTES
    assert "184.31 GiB" in card.total_source and "vllm-project/vllm#43951" in card.total_source
    # the same chip's two readings on B200: nvidia-smi 183359 MiB, torch 178.35 GiB (pytorch/ao#4002's device
    # query; OOM messages "a total capacity of 178.35 GiB"): nvidia-smi shows 729 MiB above torch's total.
    # GB200's nvidia-smi shows 189471 MiB: 738 MiB above the 184.31 GiB, the same gap within torch's rounding
    # (0.005 GiB = 5 MiB) and a few MiB of driver difference
    b200_gap = 183359 - 178.35 * 1024
    gb200_gap = 189471 - card.cuda_total_bytes / MIB
    assert abs(gb200_gap - b200_gap) < 16
    # and far from the 186 GB (173.2 GiB) as sold that ckplan held before
    assert card.cuda_total_bytes - (186 * 10**9 - 454 * MIB) > 11 * GIB


def test_a_gb200_jobs_cap_is_the_cards_usable_memory(tmp_path):
    path = tmp_path / "args.yaml"
    path.write_text("MODEL_ARGS:\n" + "".join(f"  {line}\n" for line in TINY))
    result = run("evaluate", "--from-megatron", path, "--gpus", 1, "--gpu", "gb200", "--json")
    assert result.exit_code == 0, result.output
    ranks = json.loads(result.output)["ranks"]
    assert [rank["cap_bytes"] for rank in ranks] == [gpu("gb200").usable_bytes]
