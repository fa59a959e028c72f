#!/usr/bin/env bash
# Estimated noise rate against the injected one (issue #14): fit each method
# on Flickr8k train at several injected noise rates (0 = the clean training
# set) and compare what the run reports with the truth. Prints the markdown
# table of BENCHMARKS.md's "Noise-rate estimate and thresholds" section and
# appends its rows to $out/noise_estimate/rows.md.
#
# Columns, all over the usable training pairs:
#   truth      injected rate (the `noisy` column that `ncclean corrupt` writes)
#   estimate   the run's estimated_noise_rate (stats.json): mean of 1 - clean_prob
#   mixture    the final division's noisy-component weight (checkpoint state)
#   count<0.5  the share of clean_prob below 0.5 (what runs reported before #14)
#   sep        the division's separation D (stats.json, `division`)
#   random-like the model's own reference (stats.json, `signal`): twice the
#              share of pairs below the median similarity of random pairings
#   precision  realised precision of the pairs kept at clean_prob >= 0.5
#              against the expected precision the run reports for that cut
#   P>=0.95    realised precision and kept share of --target-precision 0.95
#              resolved on the training clean_probs (the rule of
#              src/curation/threshold.rs, mirrored here in numpy)
#   warning    the division warning fit printed, if any
#
# Needs the data and feature cache examples/benchmarks.sh makes
# (target/flickr8k, or NCCLEAN_BENCH_DATA / NCCLEAN_BENCH_CACHE), numpy and
# pyarrow. Usage: bash examples/bench_noise_estimate.sh [METHODS...]
# (default: gsc vanilla). Environment: RATES (default "0 0.2 0.35 0.5"),
# NCCLEAN_BIN (a built binary to use instead of building the dev one).
set -euo pipefail
cd "$(dirname "$0")/.."
methods=("$@"); [ ${#methods[@]} -gt 0 ] || methods=(gsc vanilla)
read -ra rates <<< "${RATES:-0 0.2 0.35 0.5}"
shared=${NCCLEAN_SHARED:-../shared}
out=target/flickr8k
data=${NCCLEAN_BENCH_DATA:-$out}
cache=${NCCLEAN_BENCH_CACHE:-$out/cache}
for f in "$data/train.parquet" "$cache"; do
  [ -e "$f" ] || { echo "missing $f: run examples/benchmarks.sh once first (it encodes the features)" >&2; exit 2; }
done
mkdir -p "$out/noise_estimate"
# A private copy: rebuilding the workspace during a run must not swap the binary.
bin=$out/noise_estimate/ncclean-bench
if [ -n "${NCCLEAN_BIN:-}" ]; then
  cp "$NCCLEAN_BIN" "$bin"
else
  cargo build --quiet --bin ncclean
  cp target/debug/ncclean "$bin"
fi
towers=(--image-encoder mobilenet_v2 --image-model "$shared/models/mobilenet_v2/model.safetensors" --text-encoder minilm --cache-dir "$cache")

# train_file RATE: the training set with RATE random noise (made once, seed 0).
train_file() {
  local rate=$1 f
  if [ "$rate" = 0 ]; then echo "$data/train.parquet"; return; fi
  f=$data/train-noisy-$rate.parquet
  [ -f "$f" ] || f=$out/train-noisy-$rate.parquet
  [ -f "$f" ] || $bin corrupt "$data/train.parquet" --rate "$rate" --seed 0 --out "$f" >/dev/null
  echo "$f"
}

echo "| method | truth | estimate | mixture | count<0.5 | sep | random-like | precision at 0.5 (expected) | P>=0.95: precision, kept | warning |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for rate in "${rates[@]}"; do
  train=$(train_file "$rate")
  for m in "${methods[@]}"; do
    run=$out/noise_estimate/$m-$rate
    $bin fit "$train" --method "$m" --out-dir "$run" --force "${towers[@]}" \
      --config examples/configs/flickr8k.toml --seed 0 >/dev/null 2>"$run.log"
    r=$(python3 - "$m" "$train" "$run" <<'PY'
import json, sys
import numpy as np
import pyarrow.parquet as pq
m, train, run = sys.argv[1:]
labels = pq.read_table(f"{run}/labels.parquet", columns=["ncclean_source_row", "ncclean_clean_prob", "ncclean_status"])
ok = np.array([s == "ok" for s in labels.column("ncclean_status").to_pylist()])
p = np.array(labels.column("ncclean_clean_prob").to_pylist(), dtype=object)[ok].astype(float)
rows = np.array(labels.column("ncclean_source_row").to_pylist())[ok]
cols = pq.read_schema(train).names
noisy = (np.array(pq.read_table(train, columns=["noisy"]).column("noisy").to_pylist(), dtype=bool)[rows]
         if "noisy" in cols else np.zeros(len(p), dtype=bool))
stats = json.load(open(f"{run}/stats.json"))
state = json.load(open(f"{run}/checkpoint/state.json"))
div = state["pipeline"].get("division") or {}
mix = div.get("mixture")
mixture = f"{1 - mix['weights'][div['clean_component']]:.3f}" if mix else "none"
cut = stats.get("cut") or {}
sep = (stats.get("mixture") or {}).get("separation")
rl = (stats.get("signal") or {}).get("random_like_share")
def precision(keep):
    return 1 - noisy[keep].mean() if keep.any() else float("nan")
kept = p >= 0.5
# --target-precision 0.95: the largest top set (whole tie groups) whose mean clean_prob is >= 0.95.
order = np.sort(p)[::-1]
means = np.cumsum(order) / np.arange(1, len(order) + 1)
ends = np.append(order[1:] < order[:-1], True)
ok_k = np.nonzero(ends & (means >= 0.95))[0]
k = ok_k[-1] + 1 if len(ok_k) else 0
tp = p >= order[k - 1] if k else np.zeros(len(p), dtype=bool)
# Runs of a binary from before #14 reported the count below 0.5: recompute.
estimate = stats["estimated_noise_rate"] if "cut" in stats else (1 - p).mean()
warn = "; ".join(w.split(":")[0] for w in stats.get("warnings", [])) or "–"
print(f"| {m} | {noisy.mean():.3f} | {estimate:.3f} | {mixture} | {(p < 0.5).mean():.3f} | "
      f"{'–' if sep is None else f'{sep:.2f}'} | {'–' if rl is None else f'{rl:.3f}'} | {precision(kept):.3f} ({cut.get('expected_precision', p[kept].mean()):.3f}) | "
      f"{precision(tp):.3f}, {tp.mean():.1%} | {warn} |")
PY
)
    echo "$r"
    echo "$r" >> "$out/noise_estimate/rows.md"
    # Keep what the table reads (labels, stats, state); drop weights and the filtered copy.
    [ -n "${KEEP_RUNS:-}" ] || rm -rf "$run/filtered.parquet" "$run"/checkpoint/*.safetensors
  done
done
