#!/usr/bin/env bash
# Tower speed on CPU (issue #10), as markdown for BENCHMARKS.md's "Tower speed"
# section: JPEG decode + resize, MobileNetV2, MiniLM and a CLIP ViT-B/32-shaped
# tower, each as a fraction of the matrix-product GFLOP/s measured in the same
# run (examples/bench_towers.rs), then the end-to-end "read rows" time of a
# fit with an empty feature cache on Flickr8k's test split (1,000 photos,
# 5,000 captions: every image decoded and encoded once, every caption once).
# Needs ../shared (Flickr8k, MobileNetV2) and MiniLM (scripts/fetch_minilm.sh).
# Usage: bash examples/bench_towers.sh [bench_towers options, e.g. --images 512]
set -euo pipefail
cd "$(dirname "$0")/.."
shared=${NCCLEAN_SHARED:-../shared}
flickr=$shared/data/flickr8k
mobilenet=$shared/models/mobilenet_v2/model.safetensors
for f in "$flickr/captions.tsv" "$mobilenet"; do
  [ -e "$f" ] || { echo "missing $f: this benchmark needs ../shared (or NCCLEAN_SHARED)" >&2; exit 2; }
done
bash scripts/fetch_minilm.sh >/dev/null
minilm=${NCCLEAN_MINILM:-$HOME/.cache/ncclean/all-MiniLM-L6-v2}
cargo build --quiet --release --bin ncclean --example bench_towers --example flickr8k_build
out=target/flickr8k
[ -f "$out/test.parquet" ] || target/release/examples/flickr8k_build "$flickr" "$out"

echo "Machine: $(nproc) cores; $(date -u +%Y-%m-%d)."
echo
target/release/examples/bench_towers "$flickr" "$mobilenet" "$minilm" --markdown "$@"

# End to end: a one-epoch fit on the test split with an empty cache; its
# read_seconds is the time from parquet rows to cached features.
cache=$(mktemp -d)
run=$(mktemp -d)
trap 'rm -rf "$cache" "$run"' EXIT
target/release/ncclean fit "$out/test.parquet" --method vanilla --epochs 1 --warmup-epochs 1 \
  --image-encoder mobilenet_v2 --image-model "$mobilenet" --text-encoder minilm --text-model "$minilm" \
  --cache-dir "$cache" --out-dir "$run/fit" --force >/dev/null 2>"$run/log" \
  || { cat "$run/log" >&2; exit 1; }
python3 - "$run/fit/stats.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
rows, secs = s["rows"], s["read_seconds"]
print()
print("| end to end | rows | read rows s | rows/s |")
print("|---|---|---|---|")
print(f"| fit, empty cache, Flickr8k test split (1,000 photos, 5,000 captions) | {rows:,} | {secs:.1f} | {rows / secs:.0f} |")
PY
