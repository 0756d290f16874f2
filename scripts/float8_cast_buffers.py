"""What torch.compile (inductor) allocates for a tensorwise Float8 cast as torchao eab345c writes it
(float8_utils.py `tensor_to_amax` / `amax_to_scale`, float8_tensor.py 153-154, `to_fp8_saturated`): prints the
wrapper's buffers. On this CPU build: the amax and the scale (0-dim) and the float8 output, no bf16 or fp32 copy of
the input (docs/framework-facts.md §138). Run: PYTHONPATH=$PWD python scripts/float8_cast_buffers.py [ROWS COLS]"""

import sys

import torch
from torch._inductor.utils import run_and_get_code

E4M3 = torch.float8_e4m3fn


def cast(x):
    amax = torch.max(torch.abs(x))  # tensor_to_amax, tensorwise
    scale = (torch.finfo(E4M3).max / torch.clamp(amax.to(torch.float64), min=1e-12)).to(torch.float32)  # amax_to_scale
    scaled = x.to(torch.float32) * scale  # float8_tensor.py 153
    return scaled.clamp(min=-torch.finfo(E4M3).max, max=torch.finfo(E4M3).max).to(E4M3), scale  # to_fp8_saturated


def main(rows: int = 256, cols: int = 64) -> None:
    x = torch.randn(rows, cols, dtype=torch.bfloat16)
    _, codes = run_and_get_code(torch.compile(cast, fullgraph=True), x)
    for code in codes:
        for line in code.splitlines():
            if line.strip().startswith("buf") and "empty_strided" in line:
                print(line.strip())


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:3]))
