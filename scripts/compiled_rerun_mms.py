"""Which matmuls torch.compile's backward of torchtitan's block reruns under a whole-block checkpoint (issue 35,
cprows; docs/published-runs.md §21.cprows, docs/framework-facts.md §79).

Compiles planner.profiler.compiled.llama_block with inductor on CPU (compiled_time.compiled_llama_block: no
checkpoint, and wrapped in torch.utils.checkpoint as torchtitan's full AC wraps it) and counts the extern matmul
kernels of each generated graph. The forward runs the block's seven linears (wq, wk, wv, wo, w1, w3, w2); the
backward without recompute two matmuls a linear (14); under the checkpoint the partitioner adds the rerun of
exactly the forward matmuls the backward needs: six, not the down projection w2, whose output no backward op reads.
So a compiled, fully checkpointed block reruns the partitioner's recompute, not a whole forward, whatever the
eager checkpoint's early_stop says.

    PYTHONPATH=. python scripts/compiled_rerun_mms.py
"""
from planner.profiler import compiled_time


def main() -> None:
    for policy in ("none", "full"):
        graphs = compiled_time.compiled_llama_block(batch=1, seq=64, hidden=256, heads=8, kv_heads=2, ffn=512,
                                                    policy=policy)
        counts = [sum(1 for k in graph if k.kind == "ExternKernelSchedulerNode" and "mm" in k.op) for graph in graphs]
        print(f"{policy}: extern matmuls, forward graph {counts[0]}, backward graph {counts[1]}")


if __name__ == "__main__":
    main()
