"""Compile scripts/compiled_block_backward.py's tiny block (torchtitan 9dec370's LLaMA block, whole-block checkpointed
as torchtitan's full AC wraps it, fullgraph, CPU) and run it once more under torch.profiler's memory events: inductor's
two wrappers and the sizes of every allocation the CPU allocator makes in the forward and in the backward.
tests/test_compiled_record_torch.py compiles one width live and reads the other from the fixture this writes.

    PYTHONPATH=$PWD python scripts/compiled_record_torch_fixture.py [--out tests/fixtures/compiled_record_torch.json]

The kernels are built one at a time in this process (`compile_threads = 1`): no pool of compile workers to start.
The vector ISA is left as torch finds it: §42.leftovers5 had also turned it off (`cpp.vec_isa_ok = False`, scalar
C++ that g++ builds faster), but the precompiled header that left behind lacks at::vec, and a later compile in the
same process (CI's worker running tests/test_compiled.py next) failed to build against it (§42.lead).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "compiled_record_torch.json"
WIDTHS = (32, 2, 1, 16, 64, 16)  # hidden, heads, kv heads, head dim, FFN, tokens
WHOLE = tuple(w if at in (1, 2) else 2 * w for at, w in enumerate(WIDTHS))  # heads kept, the rest doubled


def _block():
    """The script's Block, its import's TORCH_COMPILE_DEBUG settings undone (they would write every later compile's
    debug files)."""
    saved = {name: os.environ.get(name) for name in ("TORCH_COMPILE_DEBUG", "TORCH_COMPILE_DEBUG_DIR")}
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from compiled_block_backward import Block

    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return Block


def compile_and_run(hidden, heads, kv_heads, head_dim, ffn, tokens) -> tuple[list[str], list[list[int]]]:
    """(the forward's and the backward's wrapper code, the bytes of each allocation torch made running the compiled
    forward, then the backward). Raises what torch.compile raises where it cannot compile here."""
    import torch
    from torch._inductor import config
    from torch._inductor.utils import run_and_get_code
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.profiler import ProfilerActivity, profile

    Block = _block()
    torch.manual_seed(0)
    block = checkpoint_wrapper(Block(hidden, heads, kv_heads, head_dim, ffn).to(torch.bfloat16), preserve_rng_state=False)
    x = torch.randn(1, tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(1, tokens, hidden, dtype=torch.bfloat16)
    compiled = torch.compile(block, fullgraph=True)
    torch._dynamo.reset()
    # one compile thread (no worker pool to start); the vector ISA left as torch finds it: compiling scalar kernels
    # here left a precompiled header without at::vec that a later compile in the same process took (CI, test_compiled)
    with config.patch({"compile_threads": 1}):
        _, codes = run_and_get_code(lambda: compiled(x).backward(grad))
    for param in block.parameters():
        param.grad = None
    x.grad = None
    made = []
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as forward:
        out = compiled(x)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as backward:
        out.backward(grad)
    for prof in (forward, backward):
        made.append([event.nbytes() for event in prof.profiler.kineto_results.events()
                     if event.name() == "[memory]" and event.nbytes() > 0])
    return list(codes), made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIXTURE)
    args = parser.parse_args()
    import torch

    codes, made = compile_and_run(*WHOLE)
    args.out.write_text(json.dumps({"torch": torch.__version__, "widths": WHOLE, "codes": codes, "made": made},
                                   indent=1) + "\n")
    print(f"{args.out}: torch {torch.__version__}, widths {WHOLE}, wrappers of {[len(c) for c in codes]} characters")


if __name__ == "__main__":
    main()
