"""Print each op of a LLaMA block's backward and the bytes of every storage it makes, in order (eager torch, CPU,
bf16): the tiny LLaMA block of tests/fixtures/llama_style.py (RMSNorm over fp32, rotary, GQA with K/V repeated
to every head before sdpa, SwiGLU). The source of docs/framework-facts.md §63 (torch's backward allocation order).
usage: PYTHONPATH=<checkout> python scripts/backward_allocs.py"""
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "fixtures"))
import llama_style as llama  # noqa: E402


class Made(TorchDispatchMode):
    """Each op with the bytes of the storages it makes (not those it was given)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        made = [t.untyped_storage().nbytes() for t in tree_leaves(out)
                if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in given]
        if made:
            print(f"{str(func):62s} {made}")
        return out


def main() -> None:
    torch.manual_seed(0)
    block = llama.DecoderBlock().to(torch.bfloat16)
    x = torch.randn(1, llama.SEQ, llama.DIM, dtype=torch.bfloat16, requires_grad=True)
    y = block(x)
    grad = torch.randn_like(y)
    print(f"torch {torch.__version__}; bytes: [tokens, f] {llama.SEQ * llama.HIDDEN * 2}, [tokens, h] "
          f"{llama.SEQ * llama.DIM * 2}, w1/w2/w3 {llama.HIDDEN * llama.DIM * 2}, wq/wo {llama.DIM * llama.DIM * 2}")
    with Made():
        y.backward(grad)


if __name__ == "__main__":
    main()
