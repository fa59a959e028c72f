#!/usr/bin/env bash
# The whole ncclean loop on generated data, from a fresh checkout:
# demo data -> inject 30% noise -> fit -> evaluate -> score again -> filter -> report.
# Usage: bash examples/quickstart.sh [OUT_DIR] [PAIRS]
# NCCLEAN=/path/to/ncclean runs that binary instead of building one (CI runs
# the loop with the ncclean a pip-installed wheel put on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-demo-out}
pairs=${2:-2000}
# The dev profile optimises dependencies at -O3 (Cargo.toml), so it runs fast
# and shares its build with `cargo test`. For an installed binary:
# cargo install --path .
# Rust 1.89+ is installed with rustup first if this machine lacks it.
if [ -n "${NCCLEAN:-}" ]; then
  bin=$NCCLEAN
else
  . scripts/ensure_rust.sh
  cargo build --quiet
  bin=target/debug/ncclean
fi
mkdir -p "$out"

"$bin" demo --out "$out" --pairs "$pairs" --seed 0
"$bin" corrupt "$out/demo.parquet" --rate 0.3 --seed 1 --out "$out/noisy.parquet"
"$bin" inspect "$out/noisy.parquet"
time "$bin" fit "$out/noisy.parquet" --method vanilla --out-dir "$out/run" --seed 0
echo "--- detection of the injected noise"
"$bin" eval --labels "$out/run/labels.parquet" --truth "$out/noisy.parquet"
echo "--- scoring again through the checkpoint"
"$bin" score "$out/noisy.parquet" --checkpoint "$out/run" --out "$out/scored.parquet"
"$bin" filter "$out/noisy.parquet" --labels "$out/run/labels.parquet" --keep-fraction 0.7 --out "$out/top70.parquet"
echo "--- the run's report (distributions, mixture, thresholds, example pairs)"
"$bin" report "$out/run"
echo "outputs in $out/: run/labels.parquet, run/filtered.parquet, run/stats.json, run/report.html, scored.parquet, top70.parquet"
