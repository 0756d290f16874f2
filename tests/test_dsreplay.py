"""DeepSpeed ZeRO 3's reserve from the caching allocator's replay of its step (planner/cost/reserve_deepspeed.py,
docs/published-runs.md §31.dsreplay, framework-facts §140): the coordinator's calls, init's buffers, the gradient
hook's bucket, and the stage's reserve taken from the replay where DeepSpeed's ZeRO 3 runs."""

from __future__ import annotations

import json

import pytest
from fixtures.cli import run_ok

from planner.cost import allocator, deepspeed_zero3, reserve_deepspeed
from planner.cost.allocator import Alloc, Free, Ready
from planner.cost.deepspeed_zero3 import Call, Submodule

MIB = 2**20
H = 1024  # the tiny GPT's width
BLOCKS = "layers.0,layers.1,layers.2,layers.3"  # its four blocks, each checkpointed whole


def test_the_coordinators_calls_by_hand():
    # a weight of 2e5 elements, then a weight of 3e5 and a bias of 10 (persistent: at most 1e5); two blocks,
    # each rerun whole; no reuse distance: every run releases what it used
    block = [Submodule("a", (200_000,)), Submodule("b", (300_000, 10))]
    runs, calls = deepspeed_zero3.calls(block, layers=2, checkpointed=True, max_reuse_numel=0,
                                        prefetch_bucket=250_000)
    assert runs[:4] == [(0, "forward", 0), (0, "forward", 1), (1, "forward", 0), (1, "forward", 1)]
    assert runs[4:8] == [(1, "recompute", 0), (1, "recompute", 1), (1, "backward", 1), (1, "backward", 0)]
    # the first run gathers its own weight and prefetches the next (3e5 elements pass the 2.5e5 bucket: one)
    assert calls[0] == Call(fetched=((0, 0, 0),), prefetched=((0, 1, 0),), released=((0, 0, 0),))
    # the second finds its weight prefetched, its bias persistent: it prefetches the next block's first weight,
    # 2e5 elements, under the bucket, so the next one too
    assert calls[1] == Call(fetched=(), prefetched=((1, 0, 0), (1, 1, 0)), released=((0, 1, 0),))
    # the third's weight is there; the queue's next entries not gathered are block 0's recompute, 2e5 + 3e5
    # elements; nothing released: the prefetch marked its weight for its recompute
    assert calls[2] == Call(fetched=(), prefetched=((0, 0, 0), (0, 1, 0)), released=())
    # the walk's elements agree with simulate's
    moments = deepspeed_zero3.simulate(block, layers=2, checkpointed=True, max_reuse_numel=0,
                                       prefetch_bucket=250_000)
    gathered = sum(sum(block[p[1]].param_numels[p[2]] for p in (*c.fetched, *c.prefetched)) for c in calls)
    assert gathered == sum(m.fetched for m in moments)


def _static(**changed) -> reserve_deepspeed.DsStatic:
    base = dict(rest=20 * MIB, partitions=10 * MIB, sub_groups=(4 * MIB, 3 * MIB), on_device=True,
                bucket_numel=5 * MIB, grad_partitions=12 * MIB, shards=8, weight_bytes=2, grad_bytes=2,
                master_bytes=4, moment_bytes=4)
    return reserve_deepspeed.DsStatic(**{**base, **changed})


def test_inits_buffers_in_the_codes_order_by_hand():
    events = reserve_deepspeed.static_events(_static())
    assert events == [Alloc(("rest",), 20 * MIB), Alloc(("partitions",), 10 * MIB),
                      Alloc(("master", 0), 16 * MIB), Alloc(("master", 1), 12 * MIB),
                      Alloc(("init_grad",), 16 * MIB),  # the largest sub-group's fp32 gradient
                      Alloc(("moment", 0, 0), 16 * MIB), Alloc(("moment", 0, 1), 16 * MIB),
                      Alloc(("moment", 1, 0), 12 * MIB), Alloc(("moment", 1, 1), 12 * MIB),
                      Free(("init_grad",)), Alloc(("bucket",), 10 * MIB), Alloc(("grad_partitions",), 12 * MIB)]
    replayed = allocator.replay(events)
    # every request of at least 10 MiB takes its own segment of its size; the bucket's 10 MiB is cut from the
    # freed 16 MiB gradient buffer (6 MiB left, over 1 MiB: split), the gradient partitions' 12 MiB need a new one
    assert replayed.reserved_peak_bytes == (20 + 10 + 16 + 12 + 16 + 2 * 16 + 2 * 12 + 12) * MIB
    assert replayed.allocated_peak_bytes == (20 + 10 + 16 + 12 + 10 + 2 * 16 + 2 * 12 + 12) * MIB


def test_under_offload_the_gpu_holds_the_partitions_and_the_bucket_alone():
    events = reserve_deepspeed.static_events(_static(on_device=False, grad_partitions=0))
    assert events == [Alloc(("rest",), 20 * MIB), Alloc(("partitions",), 10 * MIB), Alloc(("bucket",), 10 * MIB)]


class _Player(reserve_deepspeed._StepPlayer):
    def __init__(self, static):  # the hook alone: no layers
        self.static, self.events, self.bucket, self.bucket_numel, self.reducing = static, [], [], 0, []


def test_the_gradient_hook_and_the_bucket_by_hand():
    player = _Player(_static(bucket_numel=100))
    player._grad(("g", 1), 30)  # fits the bucket: copied in, its .grad freed on the reduce stream
    player._grad(("g", 2), 80)  # 30 + 80 passes 100: the bucket is reduced first, then g2 copied in
    player._grad(("g", 3), 150)  # passes it alone: the bucket reduced (g1's reduce done), g3 kept in its .grad
    assert player.events == [
        Alloc(("g", 1), 60), Free(("g", 1), deferred=True),
        Alloc(("g", 2), 160), Free(("g", 1), deferred=True), Free(("g", 2), deferred=True),
        Alloc(("g", 3), 300), Ready(("g", 1)), Free(("g", 2), deferred=True)]
    assert player.bucket == [(("g", 3), 150)] and player.reducing == [("g", 2)]


def test_under_offload_each_partition_passes_through_the_device_on_the_reduce_stream():
    player = _Player(_static(bucket_numel=100, on_device=False))
    player._grad(("g", 1), 160)  # 160 elements over 8 ranks: a 20-element partition, 2 B each
    player._reduce()
    assert player.events == [Alloc(("g", 1), 320), Alloc(("partition", ("g", 1)), 40, reserve_deepspeed.REDUCE),
                             Free(("partition", ("g", 1))), Free(("g", 1), deferred=True)]


@pytest.fixture(scope="module")
def gpt_profile(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dsreplay")
    config = folder / "gpt.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_embd": H, "n_layer": 4, "n_head": 8,
                                  "vocab_size": 1024, "n_positions": 256,
                                  "activation_function": "gelu_pytorch_tanh"}))
    run_ok("profile", "--arch-config", config, "--seq-len", 256, "--micro-batch-size", 2, "--gpu", "a100-80g",
           "--attention", "eager", "--out", folder / "p.json")
    return folder / "p.json"


def _evaluate(profile, *extra):
    args = ("evaluate", "--profile", profile, "--layers-per-stage", 6, "--checkpoint", BLOCKS, "--dp", 8,
            "--microbatches", 1, "--precision", "bf16-mixed", "--json", *extra)
    return json.loads(run_ok(*args).stdout)["hand"]["stages"][0]


def test_deepspeeds_zero3_takes_the_replays_reserve_and_zero2_the_divisors(gpt_profile, monkeypatch):
    played = []
    original = allocator.settled_replay

    def spy(static, step, **named):
        played.append((list(static), step(0)))
        return original(static, step, **named)

    monkeypatch.setattr(allocator, "settled_replay", spy)
    stage = _evaluate(gpt_profile, "--runtime", "deepspeed", "--zero", 3)
    assert stage["reserved_by"] == "replay"
    static, step = played[-1]
    assert [e.key for e in static][:2] == [("rest",), ("partitions",)]
    gathers = [e for e in step if type(e) is Alloc and e.key[0] == "gathered"]
    assert gathers and {e.stream for e in gathers} == {reserve_deepspeed.GATHER}
    # each block's 4h^2 weight gathered in its forward, recompute (and backward where released between them)
    assert sum(1 for e in gathers if e.nbytes == 4 * H * H * 2) >= 2 * 4
    assert not any(e.key[0] == "ckpt" for e in step if type(e) is Alloc)  # the checkpoints stay on the GPU
    assert _evaluate(gpt_profile, "--runtime", "deepspeed", "--zero", 2)["reserved_by"] == "divisor"


def test_cpu_checkpointing_brings_each_blocks_input_back_before_its_rerun(gpt_profile, monkeypatch):
    played = []
    original = allocator.settled_replay

    def spy(static, step, **named):
        played.append(step(0))
        return original(static, step, **named)

    monkeypatch.setattr(allocator, "settled_replay", spy)
    _evaluate(gpt_profile, "--runtime", "deepspeed", "--zero", 3, "--checkpoint-in-cpu")
    # evaluate scores its baselines too (no recompute: no checkpoint); the hand plan's replay brings back four
    back = max(([e for e in step if type(e) is Alloc and e.key[0] == "ckpt"] for step in played), key=len)
    assert len(back) == 4 and {e.nbytes for e in back} == {256 * 2 * H * 2}  # s x b x h in bf16, each block
