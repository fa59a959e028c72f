#!/usr/bin/env bash
# Vanilla training speed against the numpy reference (issue #35 item 3),
# interleaved: each repetition runs `ncclean fit --method vanilla` (this
# build; and $BASELINE, an older ncclean binary, when given) and
# examples/reference/vanilla_numpy.py (same head, losses, mixture, Adam with
# clipping and schedule; numpy/OpenBLAS on both cores) one after the other
# on the same 30,000 cached Flickr8k pairs with 20% noise
# (examples/configs/flickr8k.toml), then prints every run and the medians
# as ratios to numpy's in the same run. When the python of
# $NCCLEAN_TORCH_VENV (default target/torch-venv) imports torch, each
# repetition also runs examples/reference/vanilla_torch.py (the numpy
# reference's steps with the head, its backward and Adam in PyTorch on the
# CPU, 2 threads): issue #35's comparator, a "PyTorch port" row; without
# torch that row is skipped and says so on stderr.
#
# Two times per run:
#   - "epochs s": the training epochs alone (ncclean: stats.json's
#     epoch_seconds, or the sum of the per-epoch times its log prints for
#     a binary older than that field; numpy: its train_s, which is its
#     epochs; PyTorch's likewise). The target of issue #35: ncclean's at
#     most PyTorch's (and numpy's).
#   - "train s": ncclean's train_seconds, which also holds the per-epoch
#     resume checkpoints, the final division and the clean-probability
#     model (BENCHMARKS.md "CPU speed" says what each takes); numpy has no
#     such steps (its final division is in its score_s).
#
# Needs what examples/bench_speed.sh needs: the data and cache
# examples/benchmarks.sh makes (target/flickr8k; $NCCLEAN_FLICKR8K names
# another directory holding train.parquet and cache/), a release build,
# and numpy + pyarrow for the reference. On a machine that others use,
# numpy's OpenBLAS threads suffer more from the load than ncclean's: read
# the load averages it prints.
# Usage: bash examples/bench_train_speed.sh [REPS]   (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
shared=${NCCLEAN_SHARED:-../shared}
out=${NCCLEAN_FLICKR8K:-target/flickr8k}
for f in "$out/train.parquet" "$out/cache"; do
  [ -e "$f" ] || { echo "missing $f: run examples/benchmarks.sh once first (it encodes the features)" >&2; exit 2; }
done
# The build at low priority: it may share the machine with the runs of
# another benchmark.
nice -n 19 cargo build --quiet --release --bin ncclean
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "${CARGO_TARGET_DIR:-target}/release/ncclean" "$work/ncclean-new"
contenders=(new)
if [ -n "${BASELINE:-}" ]; then
  cp "$BASELINE" "$work/ncclean-old"
  contenders=(old new)
fi
train="$out/train-noisy-0.2.parquet"
[ -f "$train" ] || "$work/ncclean-new" corrupt "$out/train.parquet" --rate 0.2 --seed 0 --out "$train" >/dev/null
towers=(--image-encoder mobilenet_v2 --image-model "$shared/models/mobilenet_v2/model.safetensors" --text-encoder minilm --cache-dir "$out/cache")

# ncclean_run NAME REP: one fit; prints "NAME REP epochs_s train_s AUROC".
ncclean_run() {
  local name=$1 rep=$2 run="$work/$1-$2"
  "$work/ncclean-$name" fit "$train" --method vanilla --out-dir "$run" \
    --force "${towers[@]}" --config examples/configs/flickr8k.toml --seed 0 >/dev/null 2>"$run.log"
  local det
  det=$("$work/ncclean-new" eval --labels "$run/labels.parquet" --truth "$train" --json)
  python3 - "$name" "$rep" "$run" "$det" <<'PY'
import json, re, sys
name, rep, run, det = sys.argv[1:]
s = json.load(open(run + "/stats.json"))
epochs = s.get("epoch_seconds")
if epochs is None:  # older binaries: the per-epoch times of the log
    epochs = sum(float(m.group(1)) for m in re.finditer(r"^epoch \d+/\d+ .*, ([0-9.]+)s", open(run + ".log").read(), re.M))
print(name, rep, f"{epochs:.2f}", f"{s['train_seconds']:.2f}", f"{json.loads(det)['auroc']:.4f}")
PY
  # A run directory holds a filtered copy of the data: not kept.
  rm -rf "$run"
}

# reference_run NAME REP PYTHON SCRIPT [ARGS]: one run of a reference script;
# prints "NAME REP epochs_s train_s AUROC" (both times its train_s: its epochs).
reference_run() {
  local name=$1 rep=$2 py=$3 script=$4
  shift 4
  "$py" "examples/reference/$script" "$train" --cache-dir "$out/cache" \
    --config examples/configs/flickr8k.toml "$@" 2>/dev/null \
    | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); print('$name', $rep, f\"{r['train_s']:.2f}\", f\"{r['train_s']:.2f}\", f\"{r['auroc']:.4f}\")"
}
numpy_run() { reference_run numpy "$1" python3 vanilla_numpy.py; }
torch_run() { reference_run torch "$1" "$torch_py" vanilla_torch.py --threads 2; }

# The PyTorch peer only where the venv's python imports torch.
venv=${NCCLEAN_TORCH_VENV:-target/torch-venv}
torch_py="$venv/bin/python"
if [ -x "$torch_py" ] && "$torch_py" -c 'import torch, numpy, pyarrow' 2>/dev/null; then
  peers=(numpy torch)
else
  echo "PyTorch: skipped (no torch in $venv)" >&2
  peers=(numpy)
fi

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at start" >&2
for rep in $(seq 1 "$reps"); do
  for c in "${contenders[@]}"; do
    ncclean_run "$c" "$rep"
  done
  for p in "${peers[@]}"; do
    "${p}_run" "$rep"
  done
done | tee "$work/runs.txt"
echo "load average $(cut -d' ' -f1-3 /proc/loadavg) at the end" >&2
python3 - "$work/runs.txt" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
by = {}
for name, _, epochs, train, auroc in rows:
    by.setdefault(name, []).append((float(epochs), float(train), auroc))
ref = statistics.median(e for e, _, _ in by["numpy"])
print()
print("| vanilla, 30k cached pairs, 20% noise | runs | epochs s (median) | epochs s (each) | ratio to numpy | train s (median) | AUROC |")
print("|---|---|---|---|---|---|---|")
label = {"old": "ncclean (baseline binary)", "new": "ncclean (this build)", "numpy": "numpy reference",
         "torch": "PyTorch port"}
for name in ["old", "new", "numpy", "torch"]:
    if name not in by:
        continue
    es = [e for e, _, _ in by[name]]
    med = statistics.median(es)
    train = statistics.median(t for _, t, _ in by[name])
    print(f"| {label[name]} | {len(es)} | {med:.2f} | {' / '.join(f'{e:.2f}' for e in es)} | "
          f"{med / ref:.2f} | {train:.2f} | {' / '.join(sorted(set(a for _, _, a in by[name])))} |")
PY
