"""What the Megatron reader (`ckplan evaluate --from-megatron`) says of every flag in the configs ckplan ships
(configs/megatron-lm, configs/megatron-bridge, configs/megatron-deepspeed): a table of flag, status, files, what.
By default only the flags that change the prediction's truth (not modelled, unknown; --all: every status).

    PYTHONPATH=$PWD python scripts/megatron_flag_audit.py [--all] [FILE ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from planner.models.configs.megatron_audit import audit, config_files

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    every = "--all" in argv
    paths = [Path(a).resolve() for a in argv if a != "--all"] or config_files(ROOT)
    rows, refused = audit(paths, ROOT)
    shown = [r for r in rows if every or r.status in ("not modelled", "unknown")]
    print(f"{len(paths)} files, {len(rows)} flag/status rows ({len(shown)} shown), "
          f"{sum(not r.classified for r in rows)} unclassified, {len(refused)} refused\n")
    print("| flag | status | files | what |\n|---|---|---|---|")
    for row in shown:
        files = ", ".join(Path(f).stem for f in row.files[:3]) + (f" +{len(row.files) - 3}" if len(row.files) > 3 else "")
        status = row.status if row.classified else "UNCLASSIFIED"
        print(f"| `{row.name}` | {status} | {len(row.files)}: {files} | {row.what} |")
    for path, why in refused.items():
        print(f"\nrefused: {path}: {why}")
    return 1 if any(not r.classified for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
