"""What Megatron-LM's functional tests log as `iteration-time`, read from their golden values at a commit
(docs/published-runs.md §29.grows): the same test case's steady step on each platform it has golden values for,
and for the checkpoint-resume tests the first run's steady step beside the second's (the same configuration,
resumed from the first run's checkpoint on the same platform).

The steady step is the median of the logged steps from the fourth on (steps 2-3 hold the warm-up, step 1 is not
logged), the harness's reading (scripts/published_rows.toml, the G rows); NaN and missing steps are skipped.

With --provenance (docs/published-runs.md §66.ghost): for each H100 G row, the commit at which its golden file's
steady step took its present value, that commit's date, Transformer Engine pin (pyproject.toml) and base image
(docker/.ngc_version.dev), and the value it replaced: which software a published figure was logged on. With --history CASE: every logging of one test's steady step
on each platform (docs/published-runs.md §68.t15: T15-T17's test).

usage: python scripts/golden_runs.py MEGATRON_GIT_DIR [--commit 93ebf8d7] [--platforms TEST ...] [--pairs]
       [--provenance] [--history CASE]
       (MEGATRON_GIT_DIR: a clone or a bare mirror of NVIDIA/Megatron-LM holding the commit)"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
from pathlib import Path

CASES = "tests/functional_tests/test_cases"
FIRST_STEADY = 4
# the G rows' test cases (scripts/published_rows.toml)
G_ROWS = {"G1": "gpt/gpt3_mcore_te_tp1_pp4_vp1_uneven_pipeline", "G2": "gpt/gpt3_mcore_te_tp1_pp4_vp1",
          "G3": "gpt/gpt3_mcore_tp1_pp2", "G4": "gpt/gpt3_mcore_tp1_pp4",
          "G5": "gpt/gpt3_mcore_te_tp2_pp2_cross_entropy_loss_fusion", "G6": "gpt/gpt3_mcore_te_tp2_pp2_mla",
          "G7": "gpt/gpt3_mcore_te_tp2_pp2_cp2",
          "G8": "gpt/gpt3_mcore_te_tp4_pp1_dist_optimizer_overlap_grad_reduce_param_gather",
          "G9": "moe/gpt3_mcore_te_tp1_pp1_te_4experts_groupedGEMM_op_fuser",
          "G10": "gpt/gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap"}


def steady_step_s(golden: dict, *, skip_first: int = 0) -> float | None:
    """The median `iteration-time` of the steps from the fourth on (and past the first `skip_first` logged steps,
    for a resumed run whose first steps are its own warm-up); None where none is logged."""
    values = golden.get("iteration-time", {}).get("values", {})
    steps = sorted((int(k), v) for k, v in values.items()
                   if isinstance(v, (int, float)) and not math.isnan(v) and int(k) >= FIRST_STEADY)
    kept = [v for _, v in steps[skip_first:]]
    return statistics.median(kept) if kept else None


def _show(git_dir: Path, commit: str, path: str) -> str | None:
    done = subprocess.run(["git", "-C", str(git_dir), "show", f"{commit}:{path}"], capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


def _files(git_dir: Path, commit: str, folder: str) -> list[str]:
    done = subprocess.run(["git", "-C", str(git_dir), "ls-tree", "-r", "--name-only", commit, folder],
                          capture_output=True, text=True, check=True)
    return done.stdout.split()


def platforms(git_dir: Path, commit: str, case: str) -> dict[str, float | None]:
    """Each golden-values file of a test case: its steady step."""
    found = {}
    for path in _files(git_dir, commit, f"{CASES}/{case}"):
        name = path.rsplit("/", 1)[-1]
        if name.startswith("golden_values") and name.endswith(".json"):
            found[name[len("golden_values_"):-len(".json")]] = steady_step_s(json.loads(_show(git_dir, commit, path)))
    return found


def resume_pairs(git_dir: Path, commit: str, platform: str = "dev_dgx_h100") -> list[tuple[str, float, float]]:
    """(case, first run, second run) steady steps of every test with both runs' golden values on `platform`; the
    second run's first two logged steps are its warm-up."""
    pairs = []
    for path in _files(git_dir, commit, CASES):
        if not path.endswith(f"golden_values_{platform}_2nd.json"):
            continue
        first = _show(git_dir, commit, path.replace("_2nd.json", ".json"))
        if first is None:
            continue
        one = steady_step_s(json.loads(first))
        two = steady_step_s(json.loads(_show(git_dir, commit, path)), skip_first=2)
        if one and two:
            pairs.append((path[len(CASES) + 1:].rsplit("/", 1)[0], one, two))
    return pairs


def te_pin(pyproject: str | None) -> str | None:
    """The Transformer Engine commit a Megatron-LM pyproject.toml pins (its `transformer-engine = { git = ...,
    rev = "..." }` source), the first 9 hex digits; None where it pins none."""
    found = re.search(r'^transformer-engine\s*=\s*\{[^}]*rev\s*=\s*"([0-9a-f]{7,40})"', pyproject or "", re.M)
    return found.group(1)[:9] if found else None


def set_at(history: list[tuple[str, float | None]]) -> tuple[str, float | None]:
    """(commit, value before it): the oldest commit of the newest run of equal values in `history` (newest first,
    (commit, steady step)), where the present value was logged, and the value the file held before that commit
    (None: it never held another)."""
    current, first = history[0][1], history[0][0]
    for commit, value in history[1:]:
        if value != current:
            return first, value
        first = commit
    return first, None


def history(git_dir: Path, commit: str, path: str) -> list[tuple[str, str, float | None]]:
    """(commit, date, steady step rounded to 0.1 ms; None where the file logs none) of every commit touching the
    golden file `path` up to `commit`, newest first: each logging of a test's figure on one platform."""
    log = subprocess.run(["git", "-C", str(git_dir), "log", "--format=%h %ad", "--date=short", commit, "--", path],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    found = []
    for line in filter(None, log):
        rev, date = line.split()
        text = _show(git_dir, rev, path)
        step = steady_step_s(json.loads(text)) if text else None
        found.append((rev, date, round(step, 4) if step else None))
    return found


def provenance(git_dir: Path, commit: str, path: str) -> dict | None:
    """Where the golden file `path` took its present steady step (set_at over the commits touching it up to
    `commit`; values rounded to 0.1 ms, so a rewrite that keeps them, e.g. NaNs dropped, is not a change); None
    where the file logs no step at `commit`."""
    logged = history(git_dir, commit, path)
    steps, dates = [(rev, step) for rev, _, step in logged], {rev: date for rev, date, _ in logged}
    if not steps or steps[0][1] is None:
        return None
    at, before = set_at(steps)
    image = (_show(git_dir, at, "docker/.ngc_version.dev") or "?").strip().rsplit(":", 1)[-1]
    return {"value": steps[0][1], "commit": at, "date": dates[at], "te": te_pin(_show(git_dir, at, "pyproject.toml")),
            "image": image, "before": before}


def g_rows(table: Path, gpu: str = "h100") -> list[tuple[str, str, bool]]:
    """(row, test case, deterministic) of the G rows on `gpu` (h100, gb200) of scripts/published_rows.toml whose
    configuration copies a functional test (its first line names the test case's model_config.yaml)."""
    import tomllib

    rows = []
    for row in tomllib.loads(table.read_text())["row"]:
        args = row["args"]
        config = re.search(r"--from-megatron (\S+)", args)
        if not row["id"].startswith("G") or f"--gpu {gpu} " not in args + " " or not config:
            continue
        text = (table.parent.parent / config.group(1)).read_text()
        case = re.search(rf"{CASES}/(\S+)/model_config\.yaml", text.split("\n", 1)[0])
        if case:
            rows.append((row["id"], case.group(1), "--deterministic-mode: true" in text))
    return rows


def host_share_bound(h100_s: float, gb200_s: float, grace_per_xeon: float) -> float:
    """The most of the H100 step that can be host issue at the Xeon's per-call time (docs/published-runs.md
    §35.tehost): GB200's host issues the same calls `grace_per_xeon` times slower (TransformerEngine#2053's torch
    Linear, 37.08 / 13.48 µs) and its step cannot be shorter than that issue, so share x h100 x ratio <= gb200."""
    return gb200_s / (h100_s * grace_per_xeon)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("git_dir", type=Path)
    parser.add_argument("--commit", default="93ebf8d7")
    parser.add_argument("--pairs", action="store_true", help="every checkpoint-resume test's two runs on DGX H100")
    parser.add_argument("--host-bound", action="store_true",
                        help="the most of each row's H100 step that can be host issue, from its GB200 run")
    parser.add_argument("--provenance", action="store_true",
                        help="the G rows' golden steps: the commit, TE pin and image each was logged on")
    parser.add_argument("--gpu", default="h100", choices=("h100", "gb200"), help="--provenance's platform")
    parser.add_argument("--history", metavar="CASE",
                        help="every logging of test CASE's steady step (e.g. gpt/gpt3_7b_tp1_pp4_memory_speed) on each "
                             "platform, with the TE pin and image of each commit")
    args = parser.parse_args()
    if args.history:
        print("| platform | commit | date | steady s | TE | image |")
        print("|---|---|---|---|---|---|")
        for path in _files(args.git_dir, args.commit, f"{CASES}/{args.history}"):
            name = Path(path).name
            if not name.startswith("golden_values_"):
                continue
            for rev, date, step in history(args.git_dir, args.commit, path):
                image = (_show(args.git_dir, rev, "docker/.ngc_version.dev") or "?").strip().rsplit(":", 1)[-1]
                shown = f"{step:.4f}" if step else "-"
                print(f"| {name[len('golden_values_'):-len('.json')]} | {rev} | {date} | {shown} | "
                      f"{te_pin(_show(args.git_dir, rev, 'pyproject.toml'))} | {image} |")
        return
    if args.provenance:
        print("| row | deterministic | steady s | logged at | date | TE | image | before s |")
        print("|---|---|---|---|---|---|---|---|")
        for row, case, det in g_rows(Path(__file__).with_name("published_rows.toml"), args.gpu):
            got = provenance(args.git_dir, args.commit, f"{CASES}/{case}/golden_values_dev_dgx_{args.gpu}.json")
            if got is None:
                print(f"| {row} | {'yes' if det else 'no'} | no {args.gpu} golden step at {args.commit} |||||")
                continue
            before = f"{got['before']:.4f}" if got["before"] else "-"
            print(f"| {row} | {'yes' if det else 'no'} | {got['value']:.4f} | {got['commit']} | {got['date']} | "
                  f"{got['te']} | {got['image']} | {before} |")
        return
    print("| row | test case | " + "steady step s by golden-values file |")
    print("|---|---|---|")
    for row, case in G_ROWS.items():
        found = platforms(args.git_dir, args.commit, case)
        text = ", ".join(f"{name} {s:.4f}" for name, s in sorted(found.items()) if s)
        print(f"| {row} | {case} | {text} |")
    if args.host_bound:
        from planner.models import archs

        ratio = archs.gpu("gb200").host_call_us / archs.gpu("h100").host_call_us
        print(f"\n| row | H100 s | GB200 s | GB200 / H100 | host share of H100's step at most (Grace {ratio:.3f}x) |")
        print("|---|---|---|---|---|")
        for row, case in G_ROWS.items():
            found = platforms(args.git_dir, args.commit, case)
            h100, gb200 = found.get("dev_dgx_h100"), found.get("dev_dgx_gb200")
            if h100 and gb200:
                bound = host_share_bound(h100, gb200, ratio)
                print(f"| {row} | {h100:.4f} | {gb200:.4f} | {gb200 / h100:.3f} | {bound:.3f} ({bound * h100:.4f} s) |")
    if args.pairs:
        print("\n| test case | first run s | second run s | second / first |")
        print("|---|---|---|---|")
        for case, one, two in resume_pairs(args.git_dir, args.commit):
            print(f"| {case} | {one:.4f} | {two:.4f} | {two / one:.2f} |")


if __name__ == "__main__":
    main()
