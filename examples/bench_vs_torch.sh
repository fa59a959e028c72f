#!/usr/bin/env bash
# MiniLM captions/s, ncclean against PyTorch (issue #35 item 1), interleaved:
# each repetition runs ncclean's fused CPU encoder, candle's BertModel (the
# encoder before issue #35) and transformers' MiniLM with mean pooling, one
# after the other, on the same 2,000 Flickr8k test captions, the same
# weights directory, length-sorted batches of 64 (windows of 512, as fit
# makes them) and 2 threads each; then the ratios.
#
# PyTorch and transformers are installed into a virtual environment
# ($NCCLEAN_TORCH_VENV, default target/torch-venv) from PyTorch's CPU wheel
# index ($PYTORCH_INDEX), else PyPI's torch (a CUDA build that runs on the CPU);
# without network, or when the install fails, the
# PyTorch column is skipped and said so.
#
# Captions: the first 2,000 rows of target/flickr8k/test.parquet (made by
# examples/flickr8k.sh; $FLICKR8K_TEST names another file), read with
# pyarrow in the same venv; without it, the first 2,000 captions of
# ../shared/data/flickr8k/captions.tsv.
# Usage: bash examples/bench_vs_torch.sh [REPS]   (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
minilm=${NCCLEAN_MINILM:-$HOME/.cache/ncclean/all-MiniLM-L6-v2}
[ -f "$minilm/model.safetensors" ] || bash scripts/fetch_minilm.sh >/dev/null
venv=${NCCLEAN_TORCH_VENV:-target/torch-venv}
index=${PYTORCH_INDEX:-https://download.pytorch.org/whl/cpu}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export RAYON_NUM_THREADS=2 CANDLE_NUM_THREADS=1 OMP_NUM_THREADS=2

have_torch=0
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import torch, transformers, pyarrow" 2>/dev/null; then
  have_torch=1
else
  echo "installing torch (CPU, from $index), transformers and pyarrow into $venv ..." >&2
  # PyPI's torch is a CUDA build (~6 GB installed with its CUDA wheels) that
  # runs on the CPU as well: the fallback where PyTorch's CPU index cannot be
  # reached (it could not from the machine of BENCHMARKS.md's side-by-side run).
  if python3 -m venv "$venv" >&2 \
    && { "$venv/bin/pip" install -q --index-url "$index" torch >&2 \
      || { echo "$index unreachable: installing PyPI's torch (a CUDA build, ~6 GB, runs on the CPU)" >&2 \
        && "$venv/bin/pip" install -q torch >&2; }; } \
    && "$venv/bin/pip" install -q transformers pyarrow >&2; then
    have_torch=1
  else
    echo "SKIPPED PyTorch: could not install torch/transformers into $venv (no network or no wheel); ncclean only" >&2
  fi
fi

caps=$work/captions.txt
test_parquet=${FLICKR8K_TEST:-target/flickr8k/test.parquet}
py=python3
[ "$have_torch" = 1 ] && py=$venv/bin/python
if [ -f "$test_parquet" ] && "$py" -c "import pyarrow" 2>/dev/null; then
  "$py" - "$test_parquet" "$caps" <<'PY'
import sys, pyarrow.parquet as pq
caps = pq.read_table(sys.argv[1], columns=["caption"]).column("caption").to_pylist()[:2000]
open(sys.argv[2], "w", encoding="utf-8").write("\n".join(c.replace("\n", " ") for c in caps) + "\n")
PY
  echo "captions: first 2,000 of $test_parquet" >&2
else
  tsv=${NCCLEAN_SHARED:-../shared}/data/flickr8k/captions.tsv
  [ -f "$tsv" ] || { echo "no $test_parquet (with pyarrow) and no $tsv: nothing to encode" >&2; exit 2; }
  tail -n +2 "$tsv" | cut -f3 | head -n 2000 >"$caps"
  echo "captions: first 2,000 of $tsv" >&2
fi

cargo build --quiet --release -p ncclean-models --example bench_minilm
bench=target/release/examples/bench_minilm
out=$work/rates
for r in $(seq "$reps"); do
  "$bench" "$minilm" "$caps" --reps 1 --backends fused,candle | grep '^rep' | awk '{print $3, $4}' | tee -a "$out"
  if [ "$have_torch" = 1 ]; then
    "$venv/bin/python" examples/bench_vs_torch.py "$minilm" "$caps" 1 2>/dev/null | tee -a "$out"
  fi
done
python3 - "$out" <<'PY'
import sys
rates = {}
for line in open(sys.argv[1]):
    name, r = line.split()
    rates.setdefault(name, []).append(float(r))
show = lambda n: " ".join(f"{r:.0f}" for r in rates[n])
print()
print("| MiniLM, 2,000 captions, length-sorted batches of 64, 2 threads | captions/s (each repetition) |")
print("|---|---|")
for n, label in [("fused", "ncclean (fused CPU encoder)"), ("candle", "ncclean before (candle BertModel)"), ("torch", "PyTorch (transformers, mean pooling)")]:
    if n in rates:
        print(f"| {label} | {show(n)} |")
for a, b in [("fused", "candle"), ("fused", "torch")]:
    if a in rates and b in rates:
        ratios = [x / y for x, y in zip(rates[a], rates[b])]
        print(f"\n{a} / {b}, repetition by repetition: " + " ".join(f"{q:.2f}" for q in ratios))
if "torch" not in rates:
    print("\nPyTorch: skipped (not installed).")
PY
