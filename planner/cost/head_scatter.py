"""The LM head's input gradient reduce-scattered by DTensor under TP + SP where the head runs eager (torchtitan 9dec370:
`apply_compile` compiles each TransformerBlock, not the head; `"output": ColwiseParallel(input_layouts=Shard(1))`),
as torch 2.6.0's code makes it (docs/framework-facts.md §219-§221):

- the output linear's node (DTensor's mm) makes the weight's gradient, then its input's, whole: [tokens, h] bf16,
  Partial (t x the sequence shard); the engine then drops the node's inputs (the logits' gradient) and its saved
  tensors (the gathered input), in that order (engine.cpp evaluate_function: call_function, then release_variables);
- the input's Redistribute node turns Partial into Shard(1) (`_redistribute.py` 321-363 `Redistribute.backward`,
  `placement_types.py` 183-212 `Shard._reduce_shard_tensor`): funcol's `reduce_scatter_tensor` on dimension 1
  (`_functional_collectives.py` 252-291) first makes `torch.cat(torch.chunk(x, t, 1))`, a second whole tensor,
  then the collective's output, the shard; the node's input (the whole gradient) goes as it returns, the cat at the
  collective's event (ProcessGroupNCCL records the input on its stream: TORCH_NCCL_AVOID_RECORD_STREAMS off by
  default), after it.

The analytic head record holds the logits' gradient, the whole gradient and the shard at once and no cat; this
module's term is the cat's peak beyond that (dX, the cat and the shard alive together, the logits' gradient gone),
and `with_cat` plays the record's program in torch's order. Only where the runtime's record says so
(RuntimeFacts.head_reduce_scatter_cat), on an analytic TP + SP head at option none (a recomputed head is not
played: no published row recomputes it). Nothing here reads a file or prints."""

from __future__ import annotations

from planner.cost.layers import LayerCost
from planner.cost.rules import layer_extra_bytes, profile_tp, runtime_facts
from planner.schema import Profile, TrainSetup

HEAD_KIND = "norm+lm_head"


def cat_bytes(layer: LayerCost, option: int, profile: Profile, setup: TrainSetup) -> int:
    """The reduce-scatter's cat: the head's whole input gradient again, t x its sequence-sharded input (bf16), where
    the record says the head's input gradient is reduce-scattered by funcol on the sequence dimension; 0 elsewhere."""
    t = profile_tp(profile)
    if (
        option != 0
        or layer.kind != HEAD_KIND
        or t == 1
        or profile.assumptions.get("sp") is not True
        or profile.source != "analytic"
        or not runtime_facts(setup).head_reduce_scatter_cat
    ):
        return 0
    return t * layer.input_bytes


def extra_bytes(layer: LayerCost, option: int, profile: Profile, setup: TrainSetup) -> int:
    """The head's backward peak at the reduce-scatter (the whole input gradient, the cat, the shard) beyond the head's
    own extra (the logits' gradient, the whole input gradient, the shard, which the record holds at once)."""
    cat = cat_bytes(layer, option, profile, setup)
    if not cat:
        return 0
    return max(0, 2 * cat + layer.input_bytes - layer_extra_bytes(layer, option))


def with_cat(program: tuple[int, ...], hands: int, cat: int, shard: int) -> tuple[tuple[int, ...], int]:
    """The head's backward program (fsdp2_layers.backward_hand's: the logits' gradient received, id 1, then the
    record's: the whole input gradient, the shard it hands on, the whole freed) in torch's order: the whole, the
    logits' gradient freed, the cat, the shard, the whole freed, the cat freed; the ids after the whole's move up by
    one. Returns the program and the id it hands on; as given where `cat` is 0 or the program is not that shape."""
    if not cat or hands < 2 or len(program) < 2:
        return program, hands
    allocs = [at for at, code in enumerate(program) if code > 0]
    if hands > len(allocs):
        return program, hands
    at = allocs[hands - 1]  # the shard
    whole = hands - 1  # the whole gradient: made just before the shard, freed right after it
    if (
        program[at] != shard
        or at < 2
        or program[at - 1] != cat
        or at + 1 >= len(program)
        or program[at + 1] != -whole
    ):
        return program, hands
    made = whole  # ids up to the whole keep theirs; the cat takes whole + 1, the rest one up

    def moved(code: int) -> int:
        return code if code > 0 or -code <= made else code - 1

    rest = tuple(moved(code) for code in program[at + 2 :])
    body = (*program[:at], -1, cat, shard, -whole, -(whole + 1))
    return (*body, *rest), hands + 1


ROWS = (
    (
        "the LM head's reduce-scatter cat beyond the head's own backward (funcol on the sequence dimension)",
        "extra",
        "layer",
        lambda layer, ckpt, ctx: extra_bytes(layer, int(ckpt), ctx.profile, ctx.setup),
        "the runtime's record (head_reduce_scatter_cat): torch 2.6.0 _functional_collectives.py 252-291 "
        "reduce_scatter_tensor's torch.cat(torch.chunk(x, t, 1)) beside the whole input gradient and its shard, the "
        "logits' gradient released first (planner/cost/head_scatter.py, framework-facts §219-§221)",
    ),
)
