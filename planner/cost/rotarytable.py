"""The rotary table a runtime's model holds as a buffer, and the copies context parallelism makes of it (the record's
rotary_table; the term "the rotary table the model holds" in planner/cost/terms.py).

torchtitan 9dec370's llama registers `freqs_cis` on every model chunk (model.py 365-368, 417-425: a buffer made by
`precompute_freqs_cis(dim // n_heads, max_seq_len, rope_theta)`, [max_seq_len, head_dim / 2] complex64, 8 B an
entry), max_seq_len the job's seq_len (train.py 107): 4 MiB at 8,192 tokens of head dim 128, 128 MiB at 262,144.
Each pipeline stage is a deep copy of the model with its own table (train.py 152-163: init_weights on every part).

Under context parallelism the step enters torch's `context_parallel` with `cp_buffers=[input_ids, labels,
model.freqs_cis]` (train.py 262-275, 9dec370), which for every buffer not in no_restore_buffers (the table) keeps a
clone of it whole to restore it after, shards it with the load balancer (`_RoundRobinLoadBalancer.shard`: a torch.cat
of the rank's two chunks, s / cp rows), clones that shard, and `resize_`s the buffer in place to the shard's shape
(the storage is not shrunk) before copying it in (torch 2.6.0 experimental/_attention.py 1157-1169, 1263-1276). The
generator's frame holds the shards' list and the last clone (the table's: it is the last buffer) while the step runs
under it. So a rank without a pipeline holds its table whole twice and its s / cp rows twice: (2 + 2 / cp) tables.
Under a pipeline `model` is the meta-device model the stages were copied from (train.py 110-111, 152-167): its table,
the one handed over, is on no device, and each stage's own is neither cloned nor sharded (torchtitan fixed that in
d9898423, 2025-01-16, not read here): one table a stage.

0 where the record says the runtime's table is not read (""), for a profile not analytic (a measured model's buffers
are its own), and for an architecture whose model in the runtime has no such table read (latent attention; a GPT
style's learned positions)."""

from __future__ import annotations

from planner.cost.rules import runtime_facts
from planner.schema import Profile, TrainSetup

COMPLEX64_BYTES = 8


def table_bytes(seq_len: int, head_dim: int) -> int:
    """One table: [seq_len, head_dim / 2] complex64."""
    return seq_len * (head_dim // 2) * COMPLEX64_BYTES


def held_tables(cp: int, stages: int) -> float:
    """How many tables' bytes a rank holds while its step runs (the module's docstring)."""
    if cp <= 1 or stages > 1:
        return 1.0
    return 2.0 + 2.0 / cp


def rotary_table_bytes(profile: Profile, stage: int, setup: TrainSetup) -> int:
    """The bytes of the rotary table (and its context-parallel copies) a stage holds all step."""
    if runtime_facts(setup).rotary_table != "model-chunk" or profile.source != "analytic":
        return 0
    shape, model = profile.assumptions, profile.assumptions.get("model")
    if not isinstance(model, dict) or model.get("kv_lora_rank") or shape.get("style", "llama") != "llama" \
            or not {"num_heads", "hidden_size"} <= set(model) or "seq_len" not in shape:
        return 0
    head_dim = model.get("head_dim") or model["hidden_size"] // model["num_heads"]
    copies = held_tables(setup.training.context_parallel, setup.pipeline.stages)
    return int(copies * table_bytes(int(shape["seq_len"]), int(head_dim)))
