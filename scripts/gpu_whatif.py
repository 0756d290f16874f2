"""Run the scoring harness with one GPU record's figures replaced: a what-if, never a shipped default.

    python scripts/gpu_whatif.py --gpu h100-96g --set bf16_tflops=835.5 --set fp8_tflops=1670.5 \\
        -- profiles --only M8,C1 --work .published-rows/whatif-nvl
    python scripts/gpu_whatif.py --gpu h100-96g --set bf16_tflops=835.5 --set fp8_tflops=1670.5 \\
        -- run --only M8,C1 --work .published-rows/whatif-nvl --out /tmp/x/nvl

Everything after `--` is scripts/published_rows.py's command line, run in this process. The replacement is made
here and in every Python process the harness starts (its `ckplan profile` children and the `one` processes that
evaluate the rows) by a `sitecustomize` module this script writes to a temporary folder: the harness's environment
for its children (`published_rows._env`, PYTHONPATH the repository) gets that folder first, and the module replaces
the record in planner.models.gpus.GPUS (dataclasses.replace) before any command reads it. A profile is stamped by planner/'s
sources, not by the table's figures, so a what-if must name a --work folder of its own (refused otherwise), or
it would reuse (or overwrite) the shipped figures' profiles.

docs/published-runs.md §21.h100g500 uses it to score the torchtitan rows at the ends of the range the 500 W
H100's BF16 rate is known to lie in (docs/gpus.md §1, row 3).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "scripts" / "published_rows.py"
DEFAULT_WORK = ROOT / ".published-rows" / "profiles"

SHIM = '''\
import dataclasses, json
from planner.models import gpus as _gpus
_key, _changes = json.loads({payload!r})
_gpus.GPUS[_key] = dataclasses.replace(_gpus.GPUS[_key], **_changes)
'''


def parse_changes(gpu_name: str, pairs: list[str]) -> tuple[str, dict[str, float]]:
    """The record's key and its replaced fields (numbers only), checked against planner's GPU record."""
    sys.path.insert(0, str(ROOT))
    from planner.errors import UserError
    from planner.models import gpus

    try:
        record = gpus.gpu(gpu_name)
    except UserError as error:
        raise SystemExit(str(error)) from None
    key = next(k for k, v in gpus.GPUS.items() if v is record)
    numeric = {f.name for f in dataclasses.fields(gpus.GPU) if f.type in ("float", "int")}
    changes: dict[str, float] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or name not in numeric:
            raise SystemExit(f"--set {pair!r}: give FIELD=NUMBER, FIELD one of the GPU record's numbers "
                             f"({', '.join(sorted(numeric))})")
        try:
            changes[name] = float(value)
        except ValueError:
            raise SystemExit(f"--set {pair!r}: {value!r} is not a number") from None
    if not changes:
        raise SystemExit("give at least one --set FIELD=NUMBER")
    return key, changes


def shim_env(shim_dir: str, key: str, changes: dict[str, float]) -> dict[str, str]:
    """This process's environment with the shim written to `shim_dir`, PYTHONPATH that folder then the repository
    (what the harness gives its children, with the shim first)."""
    Path(shim_dir, "sitecustomize.py").write_text(SHIM.format(payload=json.dumps([key, changes])))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([shim_dir, str(ROOT)])}


def load_harness(shim_dir: str, key: str, changes: dict[str, float]):
    """scripts/published_rows.py loaded here, its children's environment carrying the shim, the record replaced
    in this process too."""
    env = shim_env(shim_dir, key, changes)
    spec = importlib.util.spec_from_file_location("published_rows", HARNESS)
    harness = importlib.util.module_from_spec(spec)
    sys.modules["published_rows"] = harness  # its dataclasses look their module up
    spec.loader.exec_module(harness)
    harness._env = lambda: dict(env)
    from planner.models import gpus

    gpus.GPUS[key] = dataclasses.replace(gpus.GPUS[key], **changes)
    return harness


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("give the harness's command line after `--` (see this script's docstring)")
    cut = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", required=True, help="the GPU record to change (a --gpu name)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=NUMBER",
                        help="a field of the record and its what-if value (repeatable)")
    args = parser.parse_args(argv[:cut])
    harness = argv[cut + 1:]
    if harness and harness[0] in ("profiles", "run", "one", "split"):
        if "--work" not in harness:
            raise SystemExit("name a --work folder of the what-if's own: profiles are stamped by planner/'s "
                             "sources, not by the GPU table's figures")
        work = Path(harness[harness.index("--work") + 1]).resolve()
        if work == DEFAULT_WORK.resolve():
            raise SystemExit(f"--work {work} holds the shipped figures' profiles: give the what-if its own")
    key, changes = parse_changes(args.gpu, args.set)
    with tempfile.TemporaryDirectory(prefix="gpu-whatif-") as shim_dir:
        print(f"what-if: {key} with {changes}", file=sys.stderr)
        return load_harness(shim_dir, key, changes).main(harness)


if __name__ == "__main__":
    sys.exit(main())
