"""Write a compiled block's record (planner/profiler/compiled_blocks/*.json) from two readings of it at two uniform
scales, as scripts/compiled_block_backward.py left them (its compile debug folders): the record at the first, each
allocation's power of the scale from the two (planner/profiler/compiled_record.py). docs/published-runs.md §41.cblock.

    PYTHONPATH=. python scripts/compiled_block_record.py FIRST_DIR 1/8 SECOND_DIR 1/4 \\
        --dims 2048,128,8,16,6656,4096 --tp 8 --settings float8,async-tp --source "..." --out NAME.json

--dims: the first reading's hidden, heads, kv heads, head dim, FFN, tokens (one microbatch; one CP rank's under
--cp), as compiled_block_backward.py's --dims (compiled_block_cp.py's under context parallelism). The block's
parameters by parameter_parts' order from the gradients the backward returns (attention_norm, wq, wk, wv, wo, ffn_norm, w1, w3, w2: the order the block's forward first uses them, which
is the order dynamo lifts them as graph inputs; w1 before w3, `self.w2(F.silu(self.w1(x)) * self.w3(x))`)."""

import argparse
import glob
import json
import os
from fractions import Fraction

from planner.profiler.compiled_record import Wrapper, block_record_calls, degrees, flash_calls_law

# parameter_parts' order (wq, wk, wv, wo, w1, w2, w3, attention_norm, ffn_norm) of each weight gradient the backward
# returns after the input's, in the graph's input order (attention_norm, wq, wk, wv, wo, ffn_norm, w1, w3, w2)
LLAMA_PARAM_ORDER = (7, 0, 1, 2, 3, 8, 4, 6, 5)


def wrapper(folder: str, kind: str) -> Wrapper:
    [found] = glob.glob(os.path.join(folder, "**", f"model__0_{kind}_*"), recursive=True)

    def read(name: str) -> str:
        path = os.path.join(found, name)
        return open(path).read() if os.path.exists(path) else ""

    return Wrapper(read("output_code.py"), read("fx_graph_readable.py"), read("ir_post_fusion.txt"))


def reading(folder: str):
    return block_record_calls(wrapper(folder, "forward"), wrapper(folder, "backward"), LLAMA_PARAM_ORDER)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("first")
    parser.add_argument("first_scale", type=Fraction)
    parser.add_argument("second")
    parser.add_argument("second_scale", type=Fraction)
    parser.add_argument("--dims", required=True)
    parser.add_argument("--tp", type=int, required=True)
    parser.add_argument("--cp", type=int, default=1, help="the CP degree read (scripts/compiled_block_cp.py's --cp)")
    parser.add_argument("--settings", default="")
    parser.add_argument("--source", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    (first, first_calls), (second, second_calls) = reading(args.first), reading(args.second)
    powers = degrees(first, args.first_scale, second, args.second_scale)
    flash_calls_law(first_calls, args.first_scale, second_calls, args.second_scale)
    hidden, heads, kv_heads, head_dim, ffn, tokens = (int(v) for v in args.dims.split(","))
    out = {"source": args.source, "tp": args.tp, **({"cp": args.cp} if args.cp > 1 else {}),
           "settings": sorted(s for s in args.settings.split(",") if s),
           "dims": {"hidden": hidden, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "ffn": ffn,
                    "tokens": tokens},
           "scales": [str(args.first_scale), str(args.second_scale)],
           "record": first.model_dump(), "powers": powers,
           "flash_backward": [[at, list(shape)] for at, shape in first_calls]}
    with open(args.out, "w") as handle:
        json.dump(out, handle, separators=(",", ":"))
        handle.write("\n")
    print(f"{args.out}: {sum(1 for c in first.forward + first.backward if c > 0)} allocations, powers "
          f"{ {d: powers.count(d) for d in sorted(set(powers))} }")


if __name__ == "__main__":
    main()
