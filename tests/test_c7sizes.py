"""FSDP2's per-parameter all-gather outputs at torch's sizes under torchao's float8 all-gather
(planner/cost/fsdp2_layers.py gathered_parts; docs/published-runs.md §35.c7sizes), counted by hand.

A LLaMA block of hidden 16, MLP 48, 4 heads and 2 K/V heads of 4 at TP 1: wq 16 x 16 = 256 elements, wk and wv
8 x 16 = 128, wo 256, w1, w2, w3 48 x 16 = 768, the two norms 16 (parameter_parts' order); 3,104 in all, of which
the seven linears' 3,072 are Float8 weights. torch 2.6.0's copy-out allocates each parameter's own output, numel x
world size in its all-gather dtype (`init_all_gather_outputs`): 1 B an element for a float8 weight, 2 B for a
bf16 norm weight. The whole (the flat all-gather output, sum of the parts) is 3,072 + 2 x 32 = 3,136 B.
"""

from __future__ import annotations

from planner.cost.fsdp2_layers import gathered_parts, tensor_split
from planner.schema import TrainSetup

PARTS = (256, 128, 128, 256, 768, 768, 768, 16, 16)
LINEARS = 3072


def setup(**fields) -> TrainSetup:
    base = dict(
        stages=1,
        microbatches=1,
        micro_batch_size=1,
        mem_caps_bytes=[2**50],
        precision="bf16-mixed",
        runtime="torchtitan",
        dp=4,
        zero=3,
        float8=True,
        fp8_all_gather=True,
    )
    return TrainSetup(**(base | fields))


def test_float8_weights_one_byte_an_element_and_the_norms_in_bf16():
    gathered = gathered_parts(PARTS, sum(PARTS), setup(), fp8_count=LINEARS)
    assert gathered == (256, 128, 128, 256, 768, 768, 768, 32, 32)
    assert sum(gathered) == 3136


def test_the_proportional_split_it_replaces_gave_the_norms_half_their_bytes():
    # 3,136 B shared by element count: each norm 16 x 3136 / 3104 = 16.2 -> 16 B (torch: 32), wq 258.6 -> 259 (256)
    assert tensor_split(3136, PARTS) == (259, 129, 129, 259, 776, 776, 776, 16, 16)


def test_without_the_float8_all_gather_every_tensor_in_bf16():
    assert gathered_parts(
        PARTS, sum(PARTS), setup(fp8_all_gather=False), fp8_count=LINEARS
    ) == tuple(2 * part for part in PARTS)
    assert gathered_parts(
        PARTS, sum(PARTS), setup(float8=False, fp8_all_gather=False), fp8_count=0
    ) == tuple(2 * part for part in PARTS)


def test_a_float8_count_no_set_of_largest_tensors_makes_splits_in_proportion():
    # 3,000 float8 elements: no set of the largest tensors adds up to it (a measured record's own tensors)
    total = 3000 + 104 * 2
    assert gathered_parts(PARTS, sum(PARTS), setup(), fp8_count=3000) == tensor_split(total, PARTS)


def test_the_device_trace_script_skips_without_cuda():
    import subprocess
    import sys
    from pathlib import Path

    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device: the script traces instead of skipping")
    script = Path(__file__).resolve().parents[1] / "scripts" / "trace_last_rank.py"
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0
    assert done.stdout.strip() == "trace_last_rank: no CUDA device here; skipped (run it on a GPU)"
