#!/usr/bin/env bash
# Memory and throughput of `ncclean score` and `fit` as the number of pairs
# grows (issue #11): generated embedding data (`ncclean demo
# --embedding-dim`), scored with a checkpoint fitted once.
#
#   bash examples/bench_scale.sh [WORKDIR]      (default target/bench-scale)
#
# Prints markdown rows for BENCHMARKS.md ("Scale"):
# - score: peak RSS (/usr/bin/time -v) and pairs/s (end to end: rows / wall
#   seconds, and the model's scoring pass alone) on 100k, 400k and 1M pairs
#   (SIZES), each ONE parquet file (SHARD_ROWS, default 1M: `score` streams a
#   file a scoring block at a time, so memory must not follow the file);
# - 400k pairs as 8 shards scored by 2 worker processes (--out-dir
#   --num-shards 2 --shard-index 0|1, started together) against 1, as a
#   wall-time ratio;
# - fit: peak RSS on 100k and 400k pairs and the slope per million pairs,
#   and `fit --sample 100000` on the 1M-pair file (memory follows the sample).
# Data and outputs stay under WORKDIR and are removed as it goes (1M pairs
# of 64 floats is ~300 MB of parquet). Needs a release build
# (`cargo build --release`) and GNU time.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${NCCLEAN_BIN:-target/release/ncclean}
work=${1:-target/bench-scale}
dim=${DIM:-64}
shard_rows=${SHARD_ROWS:-1000000}
sizes=${SIZES:-"100000 400000 1000000"}
[ -x "$bin" ] || { echo "no $bin: run cargo build --release first" >&2; exit 2; }
mkdir -p "$work"

# Generate N pairs as ceil(N / rows) files (rows: $2, default shard_rows) into $3.
gen() {
  local n=$1 rows=${2:-$shard_rows} dir=${3:-$work/data-$1}
  local shards=$(( (n + rows - 1) / rows ))
  rm -rf "$dir"
  "$bin" demo --out "$dir" --pairs "$n" --embedding-dim "$dim" \
    --shards "$shards" --seed 0 >/dev/null 2>&1
}

# Run a command under GNU time; print "peak_kb wall_s" and keep its stdout.
measure() {
  local log="$work/time.log"
  /usr/bin/time -v "$@" >"$work/stdout.json" 2>"$log"
  local kb wall
  kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$log")
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$log" |
    awk -F: '{ if (NF == 3) print $1*3600 + $2*60 + $3; else print $1*60 + $2 }')
  echo "$kb $wall"
}

files() { echo $(( ($1 + shard_rows - 1) / shard_rows )); }

fit_n=${FIT_PAIRS:-100000}
gen "$fit_n"
rm -rf "$work/run"
read -r fit_kb fit_wall < <(measure "$bin" fit "$work/data-$fit_n" --out-dir "$work/run" \
  --method vanilla --epochs 2 --warmup-epochs 1 --seed 0)
echo "fit on $fit_n pairs: ${fit_wall}s, peak $((fit_kb / 1024)) MB" >&2

echo "| command | pairs | files | peak RSS MB | wall s | pairs/s (end to end) | pairs/s (scoring pass) |"
echo "|---|---|---|---|---|---|---|"
echo "| fit (vanilla, 2 epochs) | $fit_n | $(files "$fit_n") | $((fit_kb / 1024)) | $fit_wall | | |"
for n in $sizes; do
  [ -d "$work/data-$n" ] || gen "$n"
  read -r kb wall < <(measure "$bin" score "$work/data-$n" --checkpoint "$work/run" \
    --out "$work/labels-$n.parquet")
  pps=$(python3 -c "import json,sys; print(round(json.load(open('$work/stdout.json'))['pairs_per_second']))")
  e2e=$(python3 -c "print(round($n / $wall))")
  echo "| score --out | $n | $(files "$n") | $((kb / 1024)) | $wall | $e2e | $pps |"
  rm -f "$work/labels-$n.parquet"
  if [ "$n" = "400000" ]; then
    # 1 worker against 2 worker processes started together, on 8 shards.
    gen "$n" 50000 "$work/shards-$n"
    rm -rf "$work/one" "$work/two"
    read -r kb1 wall1 < <(measure "$bin" score "$work/shards-$n" --checkpoint "$work/run" \
      --out-dir "$work/one")
    start=$(date +%s.%N)
    for i in 0 1; do
      "$bin" score "$work/shards-$n" --checkpoint "$work/run" --out-dir "$work/two" \
        --num-shards 2 --shard-index $i >/dev/null 2>&1 &
    done
    wait
    wall2=$(python3 -c "import time; print(round(time.time() - $start, 2))")
    echo "| score --out-dir, 1 worker | $n | 8 | $((kb1 / 1024)) | $wall1 | $(python3 -c "print(round($n / $wall1))") | |"
    echo "| score --out-dir, 2 workers (--num-shards 2) | $n | 8 | | $wall2 | $(python3 -c "print(round($n / $wall2))") | |"
    echo "2-worker speed-up on $n pairs: $(python3 -c "print(round($wall1 / $wall2, 2))")x" >&2
    rm -rf "$work/one" "$work/two" "$work/shards-$n"
    # Fit memory per million pairs: fit on 400k as well.
    if [ -z "${SKIP_FIT_SLOPE:-}" ]; then
      rm -rf "$work/run400"
      read -r f4_kb f4_wall < <(measure "$bin" fit "$work/data-$n" --out-dir "$work/run400" \
        --method vanilla --epochs 2 --warmup-epochs 1 --seed 0)
      echo "| fit (vanilla, 2 epochs) | $n | $(files "$n") | $((f4_kb / 1024)) | $f4_wall | | |"
      echo "fit memory per million pairs: $(python3 -c "print(round(($f4_kb - $fit_kb) / 1024 / (($n - $fit_n) / 1e6)))") MB" >&2
      rm -rf "$work/run400"
    fi
  fi
  if [ "$n" = "1000000" ] && [ -z "${SKIP_FIT_SAMPLE:-}" ]; then
    # Fit on a sample of the 1M pairs: memory follows the sample.
    rm -rf "$work/runs"
    read -r fs_kb fs_wall < <(measure "$bin" fit "$work/data-$n" --out-dir "$work/runs" \
      --sample "$fit_n" --method vanilla --epochs 2 --warmup-epochs 1 --seed 0)
    echo "| fit --sample $fit_n (vanilla, 2 epochs) | $n | $(files "$n") | $((fs_kb / 1024)) | $fs_wall | | |"
    rm -rf "$work/runs"
  fi
  [ "$n" = "$fit_n" ] || rm -rf "$work/data-$n"
done
rm -rf "$work/data-$fit_n" "$work/run" "$work/stdout.json" "$work/time.log"
