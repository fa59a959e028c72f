#!/usr/bin/env bash
# Quality under harder noise (issue #15): every method at random noise
# 20/50/60/70% and hard noise 20/50% on Flickr8k train (frozen MobileNetV2 +
# MiniLM features, cached), plus the closed-form ridge reference
# (examples/reference/ridge_numpy.py) on the same pairs. Prints markdown rows
# for BENCHMARKS.md's "Harder noise" table and appends them to
# $out/quality/rows.md.
#
# Needs the data and cache examples/benchmarks.sh makes (target/flickr8k, or
# NCCLEAN_BENCH_DATA / NCCLEAN_BENCH_CACHE), GNU time, numpy + pyarrow.
# Usage: bash examples/bench_quality.sh [METHODS...]
#   (default: ridge vanilla esc gsc crcl; recon is ~12 min a fit on 2 cores)
# Environment:
#   NOISES   noise settings, MODE-RATE (default "random-0.2 random-0.5
#            random-0.6 random-0.7 hard-0.2 hard-0.5")
#   LABEL    suffix of the row labels and run directories (default none)
#   FIT_ARGS extra `ncclean fit` arguments for every method (e.g. --set ...)
#   PROFILE  debug (default) or release: which build is measured
set -euo pipefail
cd "$(dirname "$0")/.."
methods=("$@"); [ ${#methods[@]} -gt 0 ] || methods=(ridge vanilla esc gsc crcl)
read -ra noises <<< "${NOISES:-random-0.2 random-0.5 random-0.6 random-0.7 hard-0.2 hard-0.5}"
read -ra fit_args <<< "${FIT_ARGS:-}"
label=${LABEL:-}
shared=${NCCLEAN_SHARED:-../shared}
out=target/flickr8k
data=${NCCLEAN_BENCH_DATA:-$out}
cache=${NCCLEAN_BENCH_CACHE:-$out/cache}
[ -x /usr/bin/time ] || { echo "needs GNU time (apt-get install time) for peak memory" >&2; exit 2; }
for f in "$data/train.parquet" "$data/test.parquet" "$cache"; do
  [ -e "$f" ] || { echo "missing $f: run examples/benchmarks.sh once first (it encodes the features)" >&2; exit 2; }
done
# PROFILE=release measures the release build (cargo build --release); the
# default is the dev build the rows before issue #10's ReCon work used.
profile=${PROFILE:-debug}
if [ "$profile" = release ]; then cargo build --quiet --release --bin ncclean; else cargo build --quiet --bin ncclean; fi
mkdir -p "$out/quality"
# A private copy: rebuilding the workspace during a run must not swap the binary.
bin=$out/quality/ncclean-bench${label:+-$label}
cp "target/$profile/ncclean" "$bin"
towers=(--image-encoder mobilenet_v2 --image-model "$shared/models/mobilenet_v2/model.safetensors" --text-encoder minilm --cache-dir "$cache")

# noisy_file MODE RATE: the corrupted training set (made once, seed 0).
noisy_file() {
  local mode=$1 rate=$2 f
  if [ "$mode" = random ]; then f=$data/train-noisy-$rate.parquet; else f=$out/train-$mode-$rate.parquet; fi
  [ -f "$f" ] || f=$out/train-$mode-$rate.parquet
  [ -f "$f" ] || $bin corrupt "$data/train.parquet" --mode "$mode" --rate "$rate" --seed 0 --out "$f" >/dev/null
  echo "$f"
}

# row NAME MODE RATE DET_JSON RET_JSON WALL RSS PPS
row() {
  python3 - "$@" <<'PY'
import json, sys
m, mode, rate, det, ret, wall, rss, pps = sys.argv[1:]
d, r = json.loads(det), json.loads(ret) if ret else None
rs = f"{r['rsum']:.1f} | {r['i2t_r1']:.1f} / {r['t2i_r1']:.1f}" if r else "– | –"
mb = f"{int(rss)/1024:.0f}" if rss else ""
print(f"| {m} | {mode} {float(rate):.0%} | {d['auroc']:.4f} | {d['ap']:.4f} | {d['f1']:.4f} | {rs} | {float(wall):.0f} | {pps} | {mb} |")
PY
}

for spec in "${noises[@]}"; do
  mode=${spec%-*} rate=${spec##*-}
  train=$(noisy_file "$mode" "$rate")
  for m in "${methods[@]}"; do
    name=$m${label:+-$label}
    run=$out/quality/$name-$mode-$rate
    if [ "$m" = ridge ]; then
      start=$(date +%s.%N)
      det=$(python3 examples/reference/ridge_numpy.py "$train" --cache-dir "$cache" --test "$data/test.parquet")
      wall=$(python3 -c "import time; print(time.time() - $start)")
      ret=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(json.dumps(d["retrieval"]))' "$det")
      r=$(row "ridge (reference)" "$mode" "$rate" "$det" "$ret" "$wall" "" "")
    else
      /usr/bin/time -f "%e %M" -o "$run.time" $bin fit "$train" --method "$m" --out-dir "$run" --force "${towers[@]}" \
        --config examples/configs/flickr8k.toml --seed 0 "${fit_args[@]}" >/dev/null 2>"$run.log"
      read -r wall rss < "$run.time"
      det=$($bin eval --labels "$run/labels.parquet" --truth "$train" --json)
      ret=$($bin eval --retrieval --checkpoint "$run" "$data/test.parquet" --cache-dir "$cache" --json 2>/dev/null)
      pps=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["score_pairs_per_second"]))' "$run/stats.json")
      r=$(row "$name" "$mode" "$rate" "$det" "$ret" "$wall" "$rss" "$pps")
      # The run directories hold checkpoints and labels (tens of MB each).
      [ -n "${KEEP_RUNS:-}" ] || rm -rf "$run"
    fi
    echo "$r"
    echo "$r" >> "$out/quality/rows.md"
  done
done
