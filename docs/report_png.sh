#!/usr/bin/env bash
# Remake docs/report.png (docs/report.md): a report of a vanilla run on
# 800 generated demo pairs with 30% injected noise, rendered by headless
# Chromium at 75% scale (about 260 KB). Demo data only: Flickr8k photos may
# not be redistributed.
# Usage: bash docs/report_png.sh [WORK_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet
bin=$(pwd)/target/debug/ncclean
work=${1:-$(mktemp -d)}
mkdir -p "$work"
(
  cd "$work"
  "$bin" demo --out . --pairs 800 --seed 0 >/dev/null
  "$bin" corrupt demo.parquet --rate 0.3 --seed 1 --out noisy.parquet >/dev/null
  "$bin" fit noisy.parquet --method vanilla --out-dir run --seed 0 --epochs 8 >/dev/null
  "$bin" report run --out report.html --per-group 6 >/dev/null
)
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
  --force-device-scale-factor=0.75 --window-size=1240,2520 \
  --screenshot="$(pwd)/docs/report.png" "file://$work/report.html" 2>/dev/null
ls -l docs/report.png
