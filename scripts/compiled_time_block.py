"""torchtitan's LLaMA block compiled by inductor on CPU: each memory-bound kernel's bytes as
inductor counts them, named by the tensor they are (planner/profiler/compiled_time.py's units),
per policy and pass, beside compiled_time.BYTES's formula and eager's (analytic_time.py).

    PYTHONPATH=. .venv/bin/python scripts/compiled_time_block.py [--shape B S H HEADS KV_HEADS FFN ...]

A shape that gives every unit a different size names every access by its size alone (a size no
unit has is printed as `?N`); at others only the totals compare. Compiling takes about a
minute a policy on one core.
"""
import argparse
from collections import Counter

from planner.models import archs
from planner.profiler import analytic_time, compiled_time
from planner.profiler.analytic import Shape

SHAPES = ((2, 20, 96, 6, 2, 224), (3, 20, 112, 7, 1, 288))  # the second: one K/V head, not recorded


def arch_of(hidden: int, heads: int, kv_heads: int, ffn: int) -> archs.Arch:
    return archs.Arch(name="probe", hidden_size=hidden, intermediate_size=ffn, num_layers=1, num_heads=heads,
                      num_kv_heads=kv_heads, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=4096)


def named(kernels, units: dict[str, int]) -> Counter:
    by_size = {size: unit for unit, size in units.items()}
    found = Counter()
    for kernel in kernels:
        if kernel.memory_bound:
            for size in (*kernel.reads.values(), *kernel.writes.values()):
                found[by_size.get(size, f"?{size}")] += 1
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", type=int, nargs=6, action="append", metavar=("B", "S", "H", "HEADS", "KV", "FFN"))
    args = parser.parse_args()
    for batch, seq, hidden, heads, kv_heads, ffn in args.shape or SHAPES:
        arch, shape = arch_of(hidden, heads, kv_heads, ffn), Shape(seq_len=seq, micro_batch_size=batch)
        units = compiled_time._units(arch, shape)
        if len(set(units.values())) != len(units):  # the totals still compare; the names are ambiguous
            print(f"shape {batch, seq, hidden, heads, kv_heads, ffn}: two units of one size, names ambiguous")
        formula = compiled_time.compiled_block_bytes(arch, shape, moe=False)
        eager = analytic_time.block_work(arch, shape)
        print(f"batch {batch} x seq {seq}, hidden {hidden}, {heads} heads ({kv_heads} K/V), SwiGLU {ffn}: units {units}")
        for policy in compiled_time.POLICIES:
            graphs = compiled_time.compiled_llama_block(batch=batch, seq=seq, hidden=hidden, heads=heads,
                                                        kv_heads=kv_heads, ffn=ffn, policy=policy)
            for index, (name, kernels) in enumerate(zip(("forward", "backward"), graphs)):
                found = compiled_time.memory_bound_bytes(kernels)
                want = formula.get(policy, (None, None))[index]
                print(f"  {policy:7s} {name:8s} inductor {found:9,d} B  formula {want if want is None else f'{want:9,d}'}"
                      f"  {'agree' if found == want else 'DIFFER'}  eager {eager[index].bytes:9,d}  "
                      f"units {dict(sorted(named(kernels, units).items()))}", flush=True)


if __name__ == "__main__":
    main()
