#!/usr/bin/env bash
# Flickr8k benchmark harness: build parquet from ../shared/data/flickr8k, inject
# noise into the training split, fit with frozen MobileNetV2 + MiniLM features,
# and evaluate detection (training pairs) and retrieval (1,000-image test split).
#
# Usage: bash examples/flickr8k.sh [METHOD] [NOISE_RATE] [extra fit flags...]
#   e.g. bash examples/flickr8k.sh vanilla 0.2
#        bash examples/flickr8k.sh vanilla 0 --epochs 12     (clean training)
# Needs ../shared (Flickr8k, MobileNetV2 weights) and MiniLM
# (bash scripts/fetch_minilm.sh). Outputs go to target/flickr8k/ (never commit them).
set -euo pipefail
cd "$(dirname "$0")/.."
method=${1:-vanilla}
rate=${2:-0.2}
shift $(( $# > 2 ? 2 : $# )) || true
shared=${NCCLEAN_SHARED:-../shared}
out=target/flickr8k
profile=${PROFILE:-dev}

[ -d "$shared/data/flickr8k" ] || { echo "no $shared/data/flickr8k: set NCCLEAN_SHARED" >&2; exit 3; }
bash scripts/fetch_minilm.sh >/dev/null
if [ "$profile" = release ]; then cargo build --release --quiet --bin ncclean --example flickr8k_build; bin=target/release; else cargo build --quiet --bin ncclean --example flickr8k_build; bin=target/debug; fi
ncclean="$bin/ncclean"

[ -f "$out/test.parquet" ] || "$bin/examples/flickr8k_build" "$shared/data/flickr8k" "$out"

train="$out/train.parquet"
if [ "$rate" != 0 ]; then
  train="$out/train-noisy-$rate.parquet"
  [ -f "$train" ] || $ncclean corrupt "$out/train.parquet" --rate "$rate" --seed 0 --out "$train"
fi
run="$out/runs/$method-$rate"
towers=(--image-encoder mobilenet_v2 --image-model "$shared/models/mobilenet_v2/model.safetensors" --text-encoder minilm --cache-dir "$out/cache")

start=$(date +%s.%N)
$ncclean fit "$train" --method "$method" --out-dir "$run" "${towers[@]}" --config examples/configs/flickr8k.toml "$@"
end=$(date +%s.%N)
echo "fit wall time: $(echo "$end - $start" | bc) s"
if [ "$rate" != 0 ]; then
  echo "--- detection on the training pairs ($rate noise)"
  $ncclean eval --labels "$run/labels.parquet" --truth "$train" --json | tee "$run/detection.json"
fi
echo "--- retrieval on the test split"
$ncclean eval --retrieval --checkpoint "$run" "$out/test.parquet" --cache-dir "$out/cache" --json | tee "$run/retrieval.json"
