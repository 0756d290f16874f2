"""What one decoder layer of a Hugging Face config saves for backward under `ckplan profile --fake`, tensor by
tensor: each storage autograd keeps (still alive when the layer's forward returns, parameters left out), its
bytes, shape, dtype and the line of the model's code that saved it, and the attention kernel the GPU's torch
picks (planner/profiler/cuda_sdpa.py). The total is the fake profile's kept bytes for that layer.

    PYTHONPATH=$PWD python scripts/fake_saved_tensors.py CONFIG.json [--seq-len 4096] [--layer 0] [--gpu h100]

What the analytic profile counts instead: planner/profiler/analytic_kept.py's terms (`block_terms`).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
import weakref
from pathlib import Path

import torch

from planner.models import archs
from planner.profiler import device_attention, fake_mode
from planner.profiler.storages import counted_as


def _origin() -> str:
    """The innermost frame in the model's code (transformers, not torch nor ckplan)."""
    frames = [f for f in traceback.extract_stack() if "/transformers/" in f.filename]
    if not frames:
        return "?"
    frame = frames[-1]
    return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} {(frame.line or '').strip()}"


def saved_tensors(config: dict, *, seq_len: int, layer: int, gpu: str) -> tuple[list[dict], dict]:
    """([{bytes, shape, dtype, origin}] of what layers.`layer` keeps, the Ran of its attention calls)."""
    model, layers, batch, mode = fake_mode.hf_model_on_meta(config, seq_len=seq_len)
    with mode, counted_as("cuda"):
        fake_mode.fake_module(model, mode)
        tokens = fake_mode.fake_tensor(batch(1)[0], mode)
        params = {p.untyped_storage()._cdata for p in model.parameters()}
        with device_attention.device_attention("cuda", archs.gpu(gpu), layers) as ran:
            x = tokens
            for _, module in layers[:layer + 1]:
                x = module(x).detach()
            x = x.requires_grad_(True)
            saved: dict[int, tuple] = {}

            def pack(tensor: torch.Tensor) -> torch.Tensor:
                storage = tensor.untyped_storage()
                if storage._cdata not in params and storage._cdata not in saved:
                    saved[storage._cdata] = (storage.nbytes(), tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."),
                                             _origin(), weakref.ref(storage))
                return tensor

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                out = layers[layer + 1][1](x)
            rows = [{"bytes": n, "shape": shape, "dtype": dtype, "origin": origin}
                    for n, shape, dtype, origin, alive in saved.values() if alive() is not None]
            del out
    return rows, ran.by_layer()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--layer", type=int, default=0, help="the decoder layer (0: the first)")
    parser.add_argument("--gpu", default="h100")
    args = parser.parse_args(argv)
    config = json.loads(args.config.read_text())
    rows, kernels = saved_tensors(config, seq_len=args.seq_len, layer=args.layer, gpu=args.gpu)
    for row in rows:
        print(f"{row['bytes']:>14,}  {str(row['shape']):26} {row['dtype']:9} {row['origin']}")
    print(f"{sum(row['bytes'] for row in rows):>14,}  total; attention kernel: {kernels}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
