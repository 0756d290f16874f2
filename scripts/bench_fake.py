"""Fake profiles of real model code at full size against the analytic formulas.

For each published configuration, `ckplan profile --hf-config CONFIG --fake` (the
transformers model built on meta and run under FakeTensorMode) and `ckplan profile
--arch-config CONFIG` (Korthikanti-style formulas) at the same sequence length and micro
batch. Prints, per model: the fake profile's wall time, parameters (fake / analytic),
and per decoder layer and for the head: kept bytes and forward FLOPs, fake against
analytic.

    .venv/bin/python scripts/bench_fake.py [--models llama3-8b,...] [--seq-len 4096]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner import io  # noqa: E402
from planner.console import console, table  # noqa: E402
from planner.models import archs  # noqa: E402
from planner.profiler import analytic  # noqa: E402
from planner.units import format_bytes  # noqa: E402

CKPLAN = str(ROOT / ".venv" / "bin" / "ckplan")

# config.json fields of the published models (the shape-setting ones)
CONFIGS = {
    "llama3-8b": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                  "max_position_embeddings": 8192},
    "llama3-70b": {"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                   "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
                   "max_position_embeddings": 8192},
    "qwen2.5-7b": {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                   "max_position_embeddings": 131072, "use_sliding_window": False},
    "qwen2.5-0.5b": {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
                     "max_position_embeddings": 32768, "tie_word_embeddings": True, "use_sliding_window": False},
    "mistral-7b": {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                   "max_position_embeddings": 32768, "sliding_window": 4096},
    "gemma-2b": {"model_type": "gemma", "hidden_size": 2048, "intermediate_size": 16384, "num_hidden_layers": 18,
                 "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 256000,
                 "max_position_embeddings": 8192, "hidden_activation": "gelu_pytorch_tanh"},
    "gpt2": {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
             "n_positions": 1024},
    # GPT-3 175B's shape (Brown et al. 2020, Table 2.1) as a GPT-2-style config
    "gpt3-175b": {"model_type": "gpt2", "n_embd": 12288, "n_layer": 96, "n_head": 96, "vocab_size": 50257,
                  "n_positions": 2048},
}


def ckplan(*args: str) -> None:
    result = subprocess.run([CKPLAN, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"ckplan {' '.join(args)} failed:\n{result.stdout}{result.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(CONFIGS))
    parser.add_argument("--seq-len", type=int, default=4096, help="tokens per sequence (GPT-2 at most 1024, "
                                                                  "GPT-3 2048: each at the smaller)")
    parser.add_argument("--micro-batch-size", type=int, default=1)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            config = CONFIGS[name]
            folder = Path(tmp) / name
            folder.mkdir()
            (folder / "config.json").write_text(json.dumps(config))
            seq = min(args.seq_len, config.get("n_positions", args.seq_len))
            common = ("--seq-len", str(seq), "--micro-batch-size", str(args.micro_batch_size))
            started = time.perf_counter()
            ckplan("profile", "--hf-config", str(folder), "--fake", *common, "--out", str(folder / "fake.json"))
            wall = time.perf_counter() - started
            ckplan("profile", "--arch-config", str(folder / "config.json"), *common, "--out", str(folder / "an.json"))
            fake, formula = io.load_profile(folder / "fake.json"), io.load_profile(folder / "an.json")
            flops = fake.assumptions["flops"]
            fake_params = sum(layer.param_count for layer in fake.layers) - sum(
                (len(t.layers) - 1) * t.param_count for t in fake.tied)
            formula_params = sum(layer.param_count for layer in formula.layers) - sum(
                (len(t.layers) - 1) * t.param_count for t in formula.tied)
            block, block_a = fake.layers[1], formula.layers[1]
            head, head_a = fake.layers[-1], formula.layers[-1]
            rows.append([
                name, str(seq), f"{wall:.1f} s", f"{fake_params:,}", f"{fake_params / formula_params:.4f}",
                format_bytes(block.act_bytes), f"{block.act_bytes / block_a.act_bytes:.3f}",
                f"{flops[block.name]['forward'] / _block_flops(config, seq, args.micro_batch_size):.4f}",
                f"{flops[block.name]['recompute'] / max(flops[block.name]['forward'], 1):.3f}",
                f"{head.act_bytes / head_a.act_bytes:.3f}", f"{fake.loss_transient_bytes / formula.loss_transient_bytes:.2f}",
            ])
    console.print(table("fake (real code under FakeTensorMode) against analytic (formulas), bf16, flash attention",
                        ["model", "seq", "fake wall", "params", "÷ formula", "block kept", "÷ formula",
                         "block FLOPs ÷", "recompute ÷ fwd", "head kept ÷", "loss scratch ÷"], rows))


def _block_flops(config: dict, seq_len: int, micro_batch_size: int) -> int:
    """The formula's forward FLOPs of one decoder block of this config."""
    arch = archs.from_hf_config(config, where="config.json", name="bench")
    return analytic.block_flops(arch, analytic.Shape(seq_len=seq_len, micro_batch_size=micro_batch_size))


if __name__ == "__main__":
    main()
