#!/usr/bin/env bash
# Parity of ncclean with the authors' loss code on identical features (issue #16).
#
# For vanilla and crcl at 20% and 50% injected noise, fits ncclean (release
# build, examples/configs/flickr8k.toml, cached MobileNetV2 + MiniLM features)
# and the numpy references in examples/reference/ on the same cached features
# with the same head, optimiser and schedule, for every seed, and prints one
# markdown table of detection AUROC: the mean over the seeds, the seeds, and
# ncclean minus the reference.
#
# The references follow the authors' released losses:
#   vanilla: NCR's ContrastiveLoss (soft margin broadcast per caption column,
#            losses summed over the batch) with split_prob and scikit-learn's
#            GMM (vanilla_numpy.py --ncr);
#   crcl:    CRCL's train_self (crcl_numpy.py).
# Both unit-normalise the cached features before the head. REF_ARGS adds
# switches to both (e.g. REF_ARGS=--raw-features, as ncclean feeds them).
#
# Needs the data and cache examples/benchmarks.sh makes (target/flickr8k, or
# PARITY_DATA=DIR), a release build, numpy and pyarrow. Not part of the test
# command: one run takes about 20 minutes on 2 cores with three seeds.
# Usage: bash examples/parity.sh [SEEDS...]   (default: 0 1 2)
#        METHODS="vanilla" RATES="0.5" bash examples/parity.sh 0
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=("$@"); [ ${#seeds[@]} -gt 0 ] || seeds=(0 1 2)
shared=${NCCLEAN_SHARED:-../shared}
data=${PARITY_DATA:-target/flickr8k}
methods=(${METHODS:-vanilla crcl})
rates=(${RATES:-0.2 0.5})
runs=target/parity
mkdir -p "$runs"
for f in "$data/train.parquet" "$data/cache"; do
  [ -e "$f" ] || { echo "missing $f: run examples/benchmarks.sh once first (it encodes the features)" >&2; exit 2; }
done
cargo build --quiet --release --bin ncclean
bin=$runs/ncclean
cp target/release/ncclean "$bin"
towers=(--image-encoder mobilenet_v2 --image-model "$shared/models/mobilenet_v2/model.safetensors"
        --text-encoder minilm --cache-dir "$data/cache")
auroc() { python3 -c 'import json, sys; print(json.load(sys.stdin)["auroc"])'; }

echo "| method | noise | ncclean AUROC | reference AUROC | ncclean − reference | ncclean seeds | reference seeds |"
echo "|---|---|---|---|---|---|---|"
for rate in "${rates[@]}"; do
  train="$data/train-noisy-$rate.parquet"
  [ -f "$train" ] || $bin corrupt "$data/train.parquet" --rate "$rate" --seed 0 --out "$train" >/dev/null
  for m in "${methods[@]}"; do
    case $m in
      vanilla) ref=(python3 examples/reference/vanilla_numpy.py --ncr) ;;
      crcl) ref=(python3 examples/reference/crcl_numpy.py) ;;
      *) echo "no numpy reference for $m" >&2; exit 2 ;;
    esac
    ours=() theirs=()
    for seed in "${seeds[@]}"; do
      run="$runs/$m-$rate-$seed"
      $bin fit "$train" --method "$m" --out-dir "$run" --force "${towers[@]}" \
        --config examples/configs/flickr8k.toml --seed "$seed" >/dev/null 2>"$run.log"
      ours+=("$($bin eval --labels "$run/labels.parquet" --truth "$train" --json | auroc)")
      rm -rf "$run"
      # shellcheck disable=SC2086  # REF_ARGS is a list of switches
      # One BLAS thread: the reference's result moves with the summation order
      # (0.9852 on one thread, 0.9861 on two, vanilla 20% seed 0).
      theirs+=("$("${ref[@]}" "$train" --cache-dir "$data/cache" --seed "$seed" --threads 1 \
        ${REF_ARGS:-} 2>"$run.ref.log" | auroc)")
    done
    python3 - "$m" "$rate" "${#seeds[@]}" "${ours[@]}" "${theirs[@]}" <<'PY'
import sys
m, rate, k = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
vals = [float(v) for v in sys.argv[4:]]
ours, theirs = vals[:k], vals[k:]
mean = lambda v: sum(v) / len(v)  # noqa: E731
fmt = lambda v: " / ".join(f"{x:.4f}" for x in v)  # noqa: E731
print(f"| {m} | {rate:.0%} | {mean(ours):.4f} | {mean(theirs):.4f} | {mean(ours) - mean(theirs):+.4f} | "
      f"{fmt(ours)} | {fmt(theirs)} |")
PY
  done
done
