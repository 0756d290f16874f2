"""The torchtitan pipeline replay's reserve with each layer's backward scratch and recompute (Fsdp2Layer.extra_bytes,
one block in planner/cost/fsdp2_events.py) made as tensors of at most PIECE_MIB each, all made before the layer's
gradients and freed after, as the one block is (a diagnostic of the one-block-a-layer assumption, not a cost term:
the allocated peak is the same; only the block sizes the caching allocator sees change).
usage: PIECE_MIB=416 PYTHONPATH=<checkout> python scripts/extra_split_sensitivity.py <ckplan evaluate arguments>"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import stage_terms  # noqa: E402

from planner.cost import fsdp2_events  # noqa: E402
from planner.cost.allocator import Alloc, Free  # noqa: E402

PIECE = int(float(os.environ.get("PIECE_MIB", "416")) * 2**20)


def backward_mb(self, mb: int) -> None:
    """fsdp2_events._PipelineStep.backward_mb with the extra in pieces."""
    add = self.events.append
    self.loss_scratch()
    add(Free(("rest", mb)))
    self.events += [Free(key) for key in self.loss_kept.pop(mb, ())]  # the loss's result (§27.order405)
    for i in range(len(self.stage.layers) - 1, -1, -1):
        layer = self.stage.layers[i]
        whole, rest = divmod(layer.extra_bytes, PIECE)
        sizes = [PIECE] * whole + ([rest] if rest else [])
        self.events += [Alloc(("extra", i, n), size, fsdp2_events.DEFAULT) for n, size in enumerate(sizes)]
        self.events += [Alloc(("grad", i, j), size, fsdp2_events.DEFAULT) for j, size in enumerate(layer.grads)]
        self.events += [Free(("extra", i, n)) for n in range(len(sizes))]
        add(Free(("kept", mb, i)))
        if i == self.first[layer.unit]:
            self.accumulate(layer.unit)


fsdp2_events._PipelineStep.backward_mb = backward_mb

if __name__ == "__main__":
    sys.exit(stage_terms.main(sys.argv[1:]))
