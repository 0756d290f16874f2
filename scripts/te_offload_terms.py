"""Print Transformer Engine's offload window as ckplan charges it for a --cpu-offloading configuration
(planner/cost/te_offload.py; docs/published-runs.md §27.teoffload).

usage: PYTHONPATH=<checkout> python scripts/te_offload_terms.py <ckplan evaluate arguments>

Calls `ckplan evaluate` with exactly the given arguments and prints, for each stage whose offload is Transformer
Engine's window: the handler (the record's te_window_handler), the block's L and N, the window map, each offloaded group's saved bytes (MiB, what moves to the
host), the most offloaded bytes held beside a layer (MiB), the host rate and each group's copy time against its
window's forward and backward compute (ms), and the exposed total per microbatch (ms).
"""
import json
import sys

from click.testing import CliRunner

from planner.cli import cli
from planner.cost import te_offload

MIB = 2**20


def main(argv: list[str]) -> int:
    seen, window_per_layer = [], te_offload.window_per_layer

    def spy(per_layer, none, kinds, fwd_ms, bwd_ms, *, ms_per_byte, handler="v2.9"):
        found = te_offload.window_layers(kinds, [v is not None for v in none])
        if found is not None:
            block, count = found
            saved = [int(none[i]["kept"]) for i in block[:count]]  # the offloaded groups'
            window = te_offload.window_map(len(block), count, handler=handler)
            spans = [range(1 if i == 0 else window[i - 1] + 1, window[i] + 1) for i in range(count)]  # v2.9's
            if handler == te_offload.V210:  # each copy issued after its own layer, waited for after window[i]
                spans = [range(i + 1, window[i] + 1) for i in range(count)]
            copy = [s * (ms_per_byte or 0.0) for s in saved]
            seen.append({
                "handler": handler, "layers": len(block), "offloaded": count, "window": window,
                "saved_mib": [round(s / MIB, 1) for s in saved],
                "held_beside_max_mib": round(max(te_offload.extra_bytes(
                    saved + [0] * (len(block) - count), count, handler=handler)) / MIB, 1),
                "host_gb_per_s": None if ms_per_byte is None else round(1e3 / ms_per_byte / 1e9, 1),
                "copy_ms": [round(c, 3) for c in copy],
                "window_fwd_ms": [round(sum(fwd_ms[block[k]] for k in span), 3) for span in spans],
                "window_bwd_ms": [round(sum(bwd_ms[block[k]] for k in span), 3) for span in spans],
                "exposed_ms": round(sum(f + b for f, b in te_offload.exposed_ms(
                    saved, [fwd_ms[i] for i in block], [bwd_ms[i] for i in block], count,
                    ms_per_byte=ms_per_byte or 0.0, handler=handler)), 3) if ms_per_byte else None})
        return window_per_layer(per_layer, none, kinds, fwd_ms, bwd_ms, ms_per_byte=ms_per_byte, handler=handler)

    te_offload.window_per_layer = spy
    result = CliRunner().invoke(cli, ["evaluate", *argv, "--json"])
    if result.exit_code:
        sys.stderr.write(result.output)
        if result.exc_info and not isinstance(result.exception, SystemExit):  # a fault, not a refusal: its trace
            import traceback

            traceback.print_exception(*result.exc_info, file=sys.stderr)
        return 1
    print(json.dumps(seen[:1]))  # the stage's first evaluation (the rest repeat it)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
