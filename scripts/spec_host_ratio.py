"""The SPEC CPU2017 medians behind DGX A100's carried host figure (planner/models/gpus.py `_HOST_EPYC_ROME`,
docs/framework-facts.md §873): SPECspeed2017_int_base and per-core SPECrate2017_int_base of the EPYC 7742 and the
Xeon Platinum 8480+, and the Xeon's 13.48 µs (TransformerEngine#2053) carried by their ratio.

Reads spec.org's CPU2017 results table as scraped in github.com/blue-plum-cloud/cpu2017data (429d1a51,
data/test.csv: one row a published result, "Base Speed Result", "Base Rate Result", "# Cores", "Processor",
"Published" as Mon-YYYY). The 8480+'s results are taken from 2024 on (after SPEC's February 2024 ruling on the
oneAPI 2022.0-2023.0 compilers' xalancbmk optimisation); --all-years takes its 2023 ones too. Run:
    git -C /work/.mirror/blue-plum-cloud+cpu2017data/repo show 429d1a51:data/test.csv > /tmp/spec.csv
    python scripts/spec_host_ratio.py /tmp/spec.csv
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys

XEON_CALL_US = 13.48  # TransformerEngine#2053: torch nn.Linear forward's CPU time on DGX H100's Xeon Platinum 8480C


def _results(path: str, processor: str, since: int) -> list[dict]:
    with open(path, newline="") as handle:
        rows = [{key.strip(): value.strip() for key, value in row.items() if key} for row in csv.DictReader(handle)]
    return [row for row in rows if processor in row["Processor"] and int(row["Published"][-4:]) >= since
            and float(row["Base Speed Result"]) > 0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", help="spec.org's CPU2017 results table (cpu2017data's data/test.csv)")
    parser.add_argument("--all-years", action="store_true", help="take the 8480+'s 2023 results too")
    args = parser.parse_args(argv)
    try:
        epyc = _results(args.csv, "EPYC 7742", 0)
        xeon = _results(args.csv, "Platinum 8480", 0 if args.all_years else 2024)
    except (OSError, KeyError, ValueError) as error:
        print(f"error: {args.csv} is not cpu2017data's results table ({error})", file=sys.stderr)
        return 2
    if not epyc or not xeon:
        print(f"error: {args.csv} lists no EPYC 7742 or Xeon Platinum 8480 results", file=sys.stderr)
        return 2
    speed = {name: statistics.median(float(r["Base Speed Result"]) for r in rows)
             for name, rows in (("EPYC 7742", epyc), ("Xeon 8480+", xeon))}
    rate = {name: statistics.median(float(r["Base Rate Result"]) / float(r["# Cores"]) for r in rows)
            for name, rows in (("EPYC 7742", epyc), ("Xeon 8480+", xeon))}
    for name, rows in (("EPYC 7742", epyc), ("Xeon 8480+", xeon)):
        print(f"{name}: {len(rows)} results, SPECspeed2017_int_base median {speed[name]:.2f}, "
              f"SPECrate2017_int_base a core median {rate[name]:.2f}")
    ratio = speed["Xeon 8480+"] / speed["EPYC 7742"]
    print(f"speed ratio {ratio:.3f}: {XEON_CALL_US} µs x {ratio:.3f} = {XEON_CALL_US * ratio:.2f} µs")
    print(f"rate-a-core ratio {rate['Xeon 8480+'] / rate['EPYC 7742']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
