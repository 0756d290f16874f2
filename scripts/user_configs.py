"""Run ckplan on the configs users have today (configs/torchtitan, configs/megatron-lm, configs/hf) and print,
per command, its exit status, the worst rank's allocated / reserved peak, the iteration line, and the first
error line (docs/published-runs.md §19.userconfigs).

    PYTHONPATH=$PWD python scripts/user_configs.py [--only SUBSTRING] [--gpu h100] COMMANDS_FILE

COMMANDS_FILE: one ckplan argument line a line (after `ckplan`); '#' starts a comment.
"""
import argparse
import re
import shlex
import subprocess
import sys

PEAK = re.compile(r"│\s*(\S+)\s*│.*│\s*([\d.]+ [GMK]iB)\s*│\s*([\d.]+ [GMK]iB)\s*│\s*([\d.]+ [GMK]iB)\s*│\s*(yes|no)\s*│", re.IGNORECASE)


def _summary(out: str) -> str:
    peaks = PEAK.findall(out)
    worst = max(peaks, key=lambda p: float(p[2].split()[0]) * {"GiB": 1024, "MiB": 1, "KiB": 1 / 1024}[p[2].split()[1]],
                default=None)
    iteration = next((ln.strip() for ln in out.splitlines() if ln.startswith("iteration")), "")
    error = next((ln.strip() for ln in out.splitlines() if ln.startswith(("Error", "Traceback"))), "")
    unread = [m.group(1) for m in re.finditer(r"^│\s*(\S+)\s*│.*not a key this reader knows", out, re.MULTILINE)]
    if unread:
        error = (error + " " if error else "") + "unknown keys: " + ", ".join(unread)
    peak = f"peak {worst[1]} alloc / {worst[2]} reserved / cap {worst[3]} fits {worst[4]}" if worst else ""
    return " | ".join(s for s in (peak, iteration, error) if s)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("commands")
    parser.add_argument("--only", default="")
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--log", help="a folder: each command's whole output as NNN.txt")
    args = parser.parse_args()
    for line in open(args.commands):
        line = line.split("#", 1)[0].strip()
        if not line or args.only not in line:
            continue
        try:
            run = subprocess.run([sys.executable, "-m", "planner.cli", *shlex.split(line)], capture_output=True,
                                 text=True, timeout=args.timeout, env={"COLUMNS": "200", **__import__("os").environ})
            out, rc = run.stdout + run.stderr, run.returncode
        except subprocess.TimeoutExpired:
            out, rc = "Error: timed out", "timeout"
        if args.log:
            __import__("os").makedirs(args.log, exist_ok=True)
            count = len(__import__("os").listdir(args.log))
            open(f"{args.log}/{count:03d}.txt", "w").write(f"$ ckplan {line}\n{out}")
        print(f"$ ckplan {line}\n  rc {rc}: {_summary(out)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
