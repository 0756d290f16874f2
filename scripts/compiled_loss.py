"""torchtitan's loss compiled by inductor (on CPU): its buffers read from the generated code, in
multiples of the bf16 logits (planner/profiler/inductor_buffers.py). The record's compiled loss
(planner/cost/runtimes.py _COMPILED_LOSS) is this script's output.

    PYTHONPATH=. .venv/bin/python scripts/compiled_loss.py [--tokens 2048] [--vocab 4096] [--code]
"""
import argparse

import torch.nn.functional as F

from planner.profiler.inductor_buffers import compiled_loss


def titan_mean(pred, labels):
    """torchtitan bbb1b616 train.py loss_fn (torch.compile'd under training.compile)."""
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def titan_sum(pred, labels):
    """torchtitan 00a388d9 torchtitan/components/loss.py cross_entropy_loss: sum over tokens,
    ignore_index -100 (divided by the global token count outside the compiled function)."""
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1), reduction="sum", ignore_index=-100)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--code", action="store_true", help="print the generated wrappers")
    args = parser.parse_args()
    for name, fn in (("torchtitan bbb1b616 (mean)", titan_mean), ("torchtitan 00a388d9 (sum, ignore_index)", titan_sum)):
        found, codes = compiled_loss(fn, tokens=args.tokens, vocab=args.vocab)
        per_token = (found.kept_bytes - found.logits_bytes) / args.tokens
        print(f"{name}: {args.tokens} tokens x {args.vocab} vocab: kept {found.kept_x:.4f}, peak {found.peak_x:.4f} "
              f"x the bf16 logits ({found.kept_bytes} B kept, {found.peak_bytes} B peak, logits "
              f"{found.logits_bytes} B; kept beyond the logits {per_token:g} B per token)")
        if args.code:
            for code in codes:
                print(code)


if __name__ == "__main__":
    main()
