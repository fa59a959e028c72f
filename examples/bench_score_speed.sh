#!/usr/bin/env bash
# End-to-end speed of default scoring (GSC, `clean_prob` from the final
# clean model) on precomputed embeddings (issue #35, item 4), with the time
# split into stages by peers measured in the same run:
#
#   bash examples/bench_score_speed.sh [WORKDIR]      (default target/bench-score)
#
# - data: ROWS (default 200,000) pairs of DIM-d (default 512) image and text
#   embeddings in LAION's layout (examples/score_bench_data.py; needs numpy and
#   pyarrow), 20% of the captions swapped;
# - two GSC checkpoints fitted on a 20,000-row sample (3 epochs, seed 0): the
#   default (`clean_prob = "reference"`, the final model) and
#   `--set clean_prob="division"` (the method's own posterior), the same
#   networks' pass without the clean model;
# - `ncclean score` of every row with each, REPS times, interleaved; with
#   BASE_BIN=path (another build, e.g. the commit before) its default score is
#   interleaved too, and its labels compared with this build's
#   (examples/compare_labels.rs: max |Δ| per column).
#
# Prints one markdown row per run: wall s (the whole process: reading,
# preparing, the check against random pairings, scoring, writing), pass s
# (the model's scoring pass, from `pairs_per_second`), and pairs/s of each;
# then the medians split into stages: outside the pass (wall - pass), the
# method's pass (the division peer's pass) and the clean model (default pass
# - division pass). Needs a release build (`cargo build --release`) and GNU
# time.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${NCCLEAN_BIN:-target/release/ncclean}
base=${BASE_BIN:-}
work=${1:-target/bench-score}
rows=${ROWS:-200000}
dim=${DIM:-512}
reps=${REPS:-2}
[ -x "$bin" ] || { echo "no $bin: run cargo build --release first" >&2; exit 2; }
python3 -c "import numpy, pyarrow" 2>/dev/null || { echo "skipped: needs numpy and pyarrow (pip install numpy pyarrow)" >&2; exit 0; }
mkdir -p "$work/bin"
# Copies, so that a rebuild cannot swap a binary mid-run.
cp "$bin" "$work/bin/new"
[ -z "$base" ] || cp "$base" "$work/bin/base"
data="$work/data-$rows-$dim.parquet"
[ -f "$data" ] || python3 examples/score_bench_data.py "$data" --rows "$rows" --dim "$dim"
for cp in reference division; do
  [ -f "$work/run-$cp/checkpoint/state.json" ] ||
    "$work/bin/new" fit "$data" --sample 20000 --method gsc --epochs 3 --seed 0 \
      --text-encoder precomputed --set "clean_prob=\"$cp\"" --out-dir "$work/run-$cp" --force >/dev/null 2>&1
done

# run NAME BINARY CHECKPOINT: one score of every row; prints "wall pass".
run() {
  local name=$1 b=$2 ck=$3
  /usr/bin/time -f "%e" -o "$work/$name.time" "$b" score "$data" --checkpoint "$work/run-$ck" \
    --out "$work/labels-$name.parquet" >"$work/$name.json" 2>/dev/null
  python3 - "$work/$name.time" "$work/$name.json" "$rows" <<'PY'
import json, sys
wall = float(open(sys.argv[1]).read().split()[-1])
s = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
print(wall, int(sys.argv[3]) / s["pairs_per_second"])
PY
}

declare -A walls passes
names=(default division)
[ -z "$base" ] || names=(base default division)
echo "| run | rep | wall s | pairs/s end to end | pass s | pairs/s scoring pass |"
echo "|---|---|---|---|---|---|"
for rep in $(seq 1 "$reps"); do
  for name in "${names[@]}"; do
    case $name in
      base) b="$work/bin/base" ck=reference ;;
      default) b="$work/bin/new" ck=reference ;;
      division) b="$work/bin/new" ck=division ;;
    esac
    read -r wall pass < <(run "$name" "$b" "$ck")
    walls[$name]+="$wall " passes[$name]+="$pass "
    python3 -c "print(f'| $name | $rep | {$wall:.2f} | {$rows / $wall:,.0f} | {$pass:.2f} | {$rows / $pass:,.0f} |')"
  done
done
python3 - "$rows" "${walls[default]}" "${passes[default]}" "${walls[division]}" "${passes[division]}" <<'PY'
import statistics as st, sys
n = int(sys.argv[1])
med = lambda s: st.median(float(x) for x in s.split())
wd, pd, wv, pv = (med(s) for s in sys.argv[2:6])
print()
print("| stage (medians) | s | pairs/s |")
print("|---|---|---|")
for name, s in [("end to end (default)", wd), ("outside the scoring pass: read, prepare, check, write", wd - pd),
                ("method's pass (GSC: embeddings, shuffled statistic, mixture)", pv),
                ("clean model (pooled features, reference search, calibration)", pd - pv),
                ("end to end with clean_prob = division", wv)]:
    print(f"| {name} | {s:.2f} | {n / s:,.0f} |")
PY
if [ -n "$base" ]; then
  mkdir -p "$work/cmp-base" "$work/cmp-new"
  cp "$work/labels-base.parquet" "$work/cmp-base/labels.parquet"
  cp "$work/labels-default.parquet" "$work/cmp-new/labels.parquet"
  cargo run --quiet --release --example compare_labels -- "$work/cmp-base" "$work/cmp-new" || true
fi
