"""A tied config's shared matrix in the analytic profile: the token embedding and the LM head as one tied set,
and the local add of the two uses' gradients on one stage (moved out of analytic.py, which reads it)."""

from __future__ import annotations

from planner.models.archs import GPU, Arch
from planner.profiler.formulas import Shape, vocab_per_device
from planner.profiler.membound import membound_ms
from planner.schema import TiedSet


def tied_embedding(arch: Arch, shape: Shape, gpu: GPU) -> list[TiedSet]:
    """The token embedding and the LM head share one matrix in a tied config. Split across
    stages each end keeps a copy, and the cost model charges their gradients' all-reduce over
    the link between the stages that hold them (rules.tied_sum_ms); `sum_ms` is the local add of
    the two uses' gradients on one stage (tied_sum_ms; planner/cost/tiedadd.py)."""
    if not arch.tie_word_embeddings:
        return []
    shared = vocab_per_device(arch, shape) * arch.hidden_size
    return [TiedSet(layers=["tok_embeddings", "output"], param_count=shared, param_bytes=shared * shape.d,
                    sum_ms=tied_sum_ms(shared * shape.d, gpu))]


# autograd's InputBuffer add of a tied parameter's two gradients on one stage (pytorch input_buffer.cpp,
# docs/framework-facts.md §249, §349): reads both, writes the sum, as measure.tied_sets times it
TIED_ADD_BYTES = 3


def tied_sum_ms(param_bytes: int, gpu: GPU) -> float:
    """What measure.tied_sets times of a tied parameter's `param_bytes`: the two uses' gradients added
    (TIED_ADD_BYTES a gradient's byte), an eager elementwise kernel at its measured HBM rate
    (membound.py): the local add on one stage (planner/cost/tiedadd.py), not the transfer between stages."""
    return membound_ms(TIED_ADD_BYTES * param_bytes, gpu, "eager", "elementwise")
