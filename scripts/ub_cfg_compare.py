"""A Megatron-LM config's iteration with its --tp-comm-overlap-cfg file and with TE's defaults (the same job without
the file), docs/published-runs.md §33.tpcfg.

usage: PYTHONPATH=<checkout> python scripts/ub_cfg_compare.py CONFIG --gpus N --gpu NAME

Reads CONFIG as `ckplan evaluate --from-megatron` does, scores it as read (the file's per-GEMM overlaps,
planner/models/configs/ub_cfg.py), then with JobSettings.ub_cfg / ub_gemms cleared (TE v2.9's get_default_config,
what Megatron-LM runs under --tp-comm-overlap without the file), and prints both iterations."""

from __future__ import annotations

import argparse
from pathlib import Path

from planner.commands.evaluate_config import predict
from planner.models.configs.megatron import read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--gpu", required=True)
    args = parser.parse_args()
    job = read(args.config)
    if job.modelled.ub_gemms is None:
        parser.error(f"{args.config} names no --tp-comm-overlap-cfg file")
    as_read = predict(job, gpus=args.gpus, gpu_name=args.gpu).cost.iteration_ms
    job.modelled.ub_cfg = job.modelled.ub_gemms = None
    defaults = predict(job, gpus=args.gpus, gpu_name=args.gpu).cost.iteration_ms
    print(f"with {args.config.name}'s file: {as_read:.3f} ms; with TE's defaults: {defaults:.3f} ms "
          f"({as_read / defaults:.4f})")


if __name__ == "__main__":
    main()
