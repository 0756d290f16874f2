"""Whether a measured profile's bytes depend on --repeats and --warmup: profiles MODEL.py twice in
this process (at the given settings and at one repeat, no warmup; --threads 1, no copy of the model
beside it, as the test suite profiles) and compares every *_bytes field of every layer, and the
parameter counts. The suite's tests of peaks profile at one repeat and no warmup (docs/testing.md);
this says what that rests on for a model.

    python scripts/profile_bytes_same.py MODEL.py --micro-batch-size 4 --repeats 2 --warmup 2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from click.testing import CliRunner


def _profile(model: str, mbs: int, repeats: int, warmup: int, out: Path) -> dict:
    import planner.profiler.threads as threads
    from planner.cli import cli

    threads.MAX_COPIES = 1  # no copy of the model on the other cores (the suite's conftest._profile_alone)
    result = CliRunner().invoke(cli, ["profile", model, "--micro-batch-size", str(mbs), "--threads", "1",
                                      "--repeats", str(repeats), "--warmup", str(warmup), "--out", str(out)])
    if result.exit_code != 0:
        raise SystemExit(result.output)
    return json.loads(out.read_text())


def byte_fields(profile: dict) -> list[tuple]:
    return [(layer["name"], key, value) for layer in profile["layers"] for key, value in sorted(layer.items())
            if key.endswith("_bytes") or key == "param_count"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--micro-batch-size", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        many = byte_fields(_profile(args.model, args.micro_batch_size, args.repeats, args.warmup, Path(folder) / "a.json"))
        one = byte_fields(_profile(args.model, args.micro_batch_size, 1, 0, Path(folder) / "b.json"))
    differ = [(a, b) for a, b in zip(many, one, strict=True) if a != b]
    print(f"{len(many)} byte fields and parameter counts; {len(differ)} differ")
    for a, b in differ:
        print(f"  {a[0]} {a[1]}: {a[2]} at --repeats {args.repeats} --warmup {args.warmup}, {b[2]} at 1, 0")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
