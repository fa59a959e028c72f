#!/usr/bin/env bash
# CPU speed of fit and score on cached Flickr8k features (issue #10), as
# markdown rows for BENCHMARKS.md's "CPU speed" section:
#   - every global-head method: fit wall time, train seconds, scoring pairs/s,
#     detection AUROC, at 20% and 50% injected noise, release build;
#   - the same vanilla fit with candle's element-wise pool at 2 threads
#     (CANDLE_NUM_THREADS=2) instead of ncclean's default 1, and the numpy
#     reference (examples/reference/vanilla_numpy.py: same head, losses,
#     mixture, optimiser and schedule), both measured in this run, so the
#     rows read as ratios.
# Needs the data and cache examples/benchmarks.sh makes (target/flickr8k), a
# release build, GNU time, and numpy + pyarrow for the reference.
# Usage: bash examples/bench_speed.sh [RATES...]   (default: 0.2 0.5)
set -euo pipefail
cd "$(dirname "$0")/.."
rates=("$@"); [ ${#rates[@]} -gt 0 ] || rates=(0.2 0.5)
shared=${NCCLEAN_SHARED:-../shared}
out=target/flickr8k
cargo build --quiet --release --bin ncclean
bin=$out/ncclean-speed
cp target/release/ncclean "$bin"
towers=(--image-encoder mobilenet_v2 --image-model "$shared/models/mobilenet_v2/model.safetensors" --text-encoder minilm --cache-dir "$out/cache")
for f in "$out/train.parquet" "$out/cache"; do
  [ -e "$f" ] || { echo "missing $f: run examples/benchmarks.sh once first (it encodes the features)" >&2; exit 2; }
done

# fit_row LABEL METHOD RATE [ENV...]: fit, then one markdown row.
fit_row() {
  local label=$1 m=$2 rate=$3; shift 3
  local train="$out/train-noisy-$rate.parquet" run="$out/speed/$label-$rate"
  mkdir -p "$out/speed"
  [ -f "$train" ] || $bin corrupt "$out/train.parquet" --rate "$rate" --seed 0 --out "$train" >/dev/null
  env "$@" /usr/bin/time -f "%e %M" -o "$run.time" $bin fit "$train" --method "$m" --out-dir "$run" --force \
    "${towers[@]}" --config examples/configs/flickr8k.toml --seed 0 >/dev/null 2>"$run.log"
  local det
  det=$($bin eval --labels "$run/labels.parquet" --truth "$train" --json)
  python3 - "$label" "$rate" "$run" "$det" <<'PY'
import json, sys
label, rate, run, det = sys.argv[1:]
wall, rss = open(run + ".time").read().split()
s = json.load(open(run + "/stats.json"))
t = s["threads"]
print(f"| {label} | {float(rate):.0%} | {json.loads(det)['auroc']:.4f} | {float(wall):.1f} | "
      f"{s['train_seconds']:.1f} | {s['score_pairs_per_second']:,.0f} | {t['matmul']}/{t['elementwise']} | {int(rss) / 1024:.0f} |")
PY
}

echo "| method | noise | AUROC | fit wall s | train s | score pairs/s | threads matmul/elementwise | peak MB |"
echo "|---|---|---|---|---|---|---|---|"
for rate in "${rates[@]}"; do
  for m in vanilla esc gsc crcl; do
    fit_row "$m" "$m" "$rate" NCCLEAN_UNUSED=1
  done
  fit_row "vanilla (CANDLE_NUM_THREADS=2)" vanilla "$rate" CANDLE_NUM_THREADS=2
  python3 examples/reference/vanilla_numpy.py "$out/train-noisy-$rate.parquet" --cache-dir "$out/cache" \
    --markdown-row 2>/dev/null
done
