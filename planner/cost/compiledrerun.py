"""Whose rule a checkpointed block's rerun follows: the eager checkpoint's, or, where the block is
compiled with its checkpoint inside, AOTAutograd's partitioner's (issue 35; docs/framework-facts.md §81).

torchtitan wraps each TransformerBlock in checkpoint_wrapper (apply_ac) and then compiles it alone
(apply_compile, fullgraph): 9dec370 parallelisms/parallelize_llama.py 67-77, bbb1b616 models/llama/
parallelize_llama.py 75-88, 2c8b5947 models/llama3/infra/parallelize.py 92-97, b5bcd76c models/llama3/
parallelize.py 46-55 ("per-TransformerBlock compile after AC wrapping"). checkpoint_wrapper calls
`partial(torch.utils.checkpoint.checkpoint, use_reentrant=False, ...)` (torch 2.6.0 distributed/algorithms/
_checkpoint/checkpoint_wrapper.py 130-136), which dynamo traces into the tag_activation_checkpoint
higher-order op (_dynamo/variables/user_defined.py 946-948, utils.py 3008-3020, variables/higher_order_ops.py
2033-2080); a whole-block checkpoint tags every op of the region PREFER_RECOMPUTE (_higher_order_ops/wrap.py
188-198, "all nodes should be recomputed"); the min-cut partitioner puts each such op on the
backward's side of the cut (must_recompute: an infinite edge to the sink, _functorch/partitioners.py
117-121, 1024-1030), so only the region's inputs are saved, and the backward graph holds just the ops
its gradients need from them (_extract_fwd_bwd_modules, 290-310): the whole forward but the ops whose
outputs no backward op reads (the down projection, the residual add after it). The eager checkpoint's
early_stop is never read there. The same at torch 2.13.0: scripts/compiled_rerun_mms.py counts 6 of
the 7 forward matmuls rerun in the compiled backward of a fully checkpointed LLaMA block.

That set is the one the profile's `recompute_ms` for full counts (an eager checkpoint that stops early:
every forward kernel but the down projection, analytic_time._recompute), timed with inductor's fused
kernels where the profile recorded the compiled block (compiled_time.timed_layers), eager's elsewhere.
"""

from __future__ import annotations

from planner.cost import runtimes

# the kinds of layer a runtime that compiles the model compiles one by one (torchtitan's apply_compile:
# each TransformerBlock; the embedding, the final norm and the output run eager)
COMPILED_KINDS = ("decoder_block", "moe_block")


def rerun_partitioned(kind: str, training) -> bool:
    """Whether a layer of this kind, checkpointed, reruns what the partitioner puts in its compiled
    backward: the setup compiles the model (training.compile) on a runtime that compiles each block with
    its checkpoint inside (its record's compiles_model), and the layer is such a block."""
    return bool(training.compile) and runtimes.of(training).compiles_model and kind in COMPILED_KINDS
