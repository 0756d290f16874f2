#!/usr/bin/env bash
# The torchtitan 405B pipeline rows (docs/published-runs.md: M17, M18 as §8's rows.sh; C5-C8 as §7.cp's
# commands on h100-96g with Float8 and its float8 all-gather, §14), each through scripts/stage_terms.py.
# usage: bash scripts/rows_405b.sh TREE PROFILES OUT [profiles]   (TREE: any checkout's planner, e.g. a base to compare)
#   with "profiles": make the analytic profiles in PROFILES first.
set -u
T=$1; P=$2; O=$3; mkdir -p "$O" "$P"
PY=/work/main/.venv/bin/python
CK="env PYTHONPATH=$T $PY -m planner.cli"
R="env PYTHONPATH=$T $PY $(dirname "$(readlink -f "$0")")/stage_terms.py"  # this checkout's wrapper, on TREE's planner
if [ "${4:-}" = profiles ]; then
  $CK profile --arch llama3.1-405b --seq-len 8192 --micro-batch-size 4 --tp 8 --sp --gpu h100-96g --out $P/l405_mbs4_96.json > $P/l405_mbs4_96.log 2>&1
  for pair in 1:32768 2:65536 4:131072 8:262144; do cp=${pair%%:*}; s=${pair##*:}
    $CK profile --arch llama3.1-405b --seq-len $s --cp $cp --tp 8 --sp --micro-batch-size 1 --gpu h100-96g \
      --out $P/l405_s${s}_cp${cp}_96.json > $P/l405_s${s}_cp${cp}_96.log 2>&1
  done
fi
TT="--precision bf16-mixed --runtime torchtitan --runtime-version 9dec370"
B126=$(seq -s, -f 'layers.%g' 0 125); F8="--float8 --fp8-all-gather"
run() { name=$1; shift; $R "$@" > $O/$name.json 2> $O/$name.err || echo "$name failed: $(tail -1 $O/$name.err)"; }
L=15,16,16,16,16,16,16,15
run M17 --profile $P/l405_mbs4_96.json --layers-per-stage $L --checkpoint $B126 --dp 8 --zero 3 --zero-gather per-iteration --microbatches 8 --mem 96GB $TT --compile --tp-overlap async-tp $F8
L16=7,8,8,8,8,8,8,8,8,8,8,8,8,8,8,7
run M18 --profile $P/l405_mbs4_96.json --layers-per-stage $L16 --checkpoint $B126 --schedule interleaved-1F1B --chunks 2 --dp 8 --zero 3 --zero-gather per-iteration --microbatches 8 --mem 96GB $TT --compile --tp-overlap async-tp $F8
CPA="--layers-per-stage $L --checkpoint $B126 --zero 3 --zero-gather per-iteration --microbatches 8 --mem 96GB --tp-overlap async-tp $TT --compile $F8"
run C5 --profile $P/l405_s32768_cp1_96.json --dp 8 --cp 1 $CPA
run C6 --profile $P/l405_s65536_cp2_96.json --dp 4 --cp 2 $CPA
run C7 --profile $P/l405_s131072_cp4_96.json --dp 2 --cp 4 $CPA
run C8 --profile $P/l405_s262144_cp8_96.json --dp 1 --cp 8 $CPA
