#!/usr/bin/env bash
# The one command to run on a GPU machine (issue #36): the device and the
# CUDA libraries found; ncclean's CPU-vs-CUDA parity (MobileNetV2, MiniLM,
# a CLIP-B/32-shaped tower), tower throughput at batch 256 in f32/f16, JPEG
# decode img/s on all cores, seconds per epoch of vanilla and gsc on 30k
# generated pairs (all from `ncclean gpu-check`); and the same towers in
# PyTorch on the same GPU (scripts/device_check.py torch), for a ratio.
# Writes OUT/device_check.json and OUT/device_check.md (the table for
# BENCHMARKS.md), plus the parts (system, libraries, ncclean, torch .json).
#
#   bash scripts/device_check.sh OUT [--binary BIN] [--assets DIR] [--cpu-only] [--quick]
#
#   OUT          folder for the results (created)
#   --binary     the ncclean to check (default: the one packed in --assets,
#                else target/cuda/release/ncclean, target/release/ncclean,
#                target/debug/ncclean)
#   --assets     a folder made by `prepare` below (default target/device-pack)
#   --cpu-only   rehearsal without a GPU: ncclean on the CPU, PyTorch on the
#                CPU (skipped with a message when torch is not importable)
#   --quick      small sizes: seconds (CI runs --cpu-only --quick)
#
# Before the call, on this machine (what to carry, measured sizes):
#   bash scripts/build_cuda.sh           # release, compute capability 90, stripped (77 MiB)
#   python3 scripts/device_check.py prepare target/device-pack \
#     --mobilenet ../shared/models/mobilenet_v2/model.safetensors \
#     --minilm ~/.cache/ncclean/all-MiniLM-L6-v2 --binary target/cuda/release/ncclean
#   That writes one target/device-pack/pack.tar.xz of ~56 MiB: the binary
#   (~11 MiB packed), MobileNetV2 and MiniLM in f16 (the towers widen them
#   back to f32; both sides of each parity check read the same file). With
#   the working tree (~3 MiB) it stays under the 64 MiB a call carries;
#   leave --minilm out if it does not (MiniLM's rows then say "skipped").
# The call (run tool), in one command of at most 9 minutes (the parts'
# limits: gpu-check 330 s, PyTorch 110 s, the demo fit 90 s):
#   carry: ["target/device-pack"]
#   command: bash scripts/device_check.sh "$OUT/check" --assets target/device-pack 2>&1 | tee "$OUT/log.txt"
#   timeout_s: 580
# Exit status: 0 done (the table says what passed); 2 usage or no CUDA device
# without --cpu-only; 4 a tower outside its parity tolerance.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
usage() { echo "usage: device_check.sh OUT [--binary BIN] [--assets DIR] [--cpu-only] [--quick]" >&2; exit 2; }
[ $# -ge 1 ] || usage
out=$1; shift
case "$out" in -*) usage ;; esac
bin= assets=$here/target/device-pack cpu_only= quick=
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) bin=${2:?--binary needs a file}; shift 2 ;;
    --assets) assets=${2:?--assets needs a folder}; shift 2 ;;
    --cpu-only) cpu_only=1; shift ;;
    --quick) quick=1; shift ;;
    *) echo "device_check.sh: unknown argument $1" >&2; usage ;;
  esac
done
# A packed assets folder (device_check.py prepare): unpack it first.
if [ -f "$assets/pack.tar.xz" ]; then
  unpacked=$(mktemp -d)
  trap 'rm -rf "$unpacked"' EXIT
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$assets/pack.tar.xz" "$unpacked" \
    || { echo "device_check.sh: cannot unpack $assets/pack.tar.xz" >&2; exit 2; }
  assets=$unpacked
  [ -z "$bin" ] && [ -f "$assets/ncclean" ] && { chmod +x "$assets/ncclean"; bin=$assets/ncclean; }
fi
if [ -z "$bin" ]; then
  for b in target/cuda/release/ncclean target/release/ncclean target/debug/ncclean; do
    [ -x "$here/$b" ] && { bin=$here/$b; break; }
  done
fi
[ -n "$bin" ] && [ -x "$bin" ] || { echo "device_check.sh: no ncclean binary (give --binary BIN)" >&2; exit 2; }
mkdir -p "$out" || exit 2
start=$(date +%s)
say() { echo "device_check.sh [$(( $(date +%s) - start ))s]: $*" >&2; }

# The towers' weights: the prepared assets, else this checkout's.
mobilenet=$assets/mobilenet_v2/model.safetensors
[ -f "$mobilenet" ] || mobilenet=${NCCLEAN_SHARED:-$here/../shared}/models/mobilenet_v2/model.safetensors
minilm=$assets/minilm
[ -f "$minilm/config.json" ] || minilm=${NCCLEAN_MINILM_DIR:-$HOME/.cache/ncclean/all-MiniLM-L6-v2}

# 1. The machine and the libraries.
gpu=none
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 | head -n 1)
fi
python3 - "$out/system.json" "$gpu" "$bin" <<'PY'
import json, os, sys
json.dump({"gpu": sys.argv[2], "cores": os.cpu_count(), "binary": sys.argv[3],
           "binary_mib": round(os.path.getsize(sys.argv[3]) / 2**20, 1)}, open(sys.argv[1], "w"))
PY
"$bin" cuda-libs --json > "$out/libraries.json"
say "GPU: $gpu; $("$bin" cuda-libs | sed -n 's/^libraries: //p')"

# 2. ncclean's measurements (parity, throughput, decode, training).
mode=()
[ -n "$cpu_only" ] && mode+=(--cpu-only)
[ -n "$quick" ] && mode+=(--quick)
weights=(--mobilenet "$mobilenet")
[ -f "$minilm/config.json" ] && weights+=(--minilm "$minilm")
say "ncclean gpu-check ${mode[*]}"
timeout 330 "$bin" gpu-check --json "$out/ncclean.json" "${mode[@]}" "${weights[@]}"
rc=$?
case $rc in
  0|4) ;;
  124) say "ncclean gpu-check ran past 330 s"
       # gpu-check saves its document after each stage: keep what it measured.
       python3 - "$out/ncclean.json" <<'PY'
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    doc = {}
doc["stopped"] = "ran past 330 s; the stages without an entry did not finish"
json.dump(doc, open(sys.argv[1], "w"), indent=1)
PY
       ;;
  *) say "ncclean gpu-check failed (exit $rc)"; [ -n "$cpu_only" ] || exit "$rc" ;;
esac

# 3. The same towers in PyTorch on the same device.
say "PyTorch towers"
torch_args=(--out "$out/torch.json" --device "$([ -n "$cpu_only" ] && echo cpu || echo cuda)" --mobilenet "$mobilenet" --minilm "$minilm")
[ -n "$quick" ] && torch_args+=(--quick)
if ! timeout 110 python3 "$here/scripts/device_check.py" torch "${torch_args[@]}"; then
  say "the PyTorch side failed or ran past 110 s"
  echo '{"skipped": "failed or ran past 110 s; see stderr"}' > "$out/torch.json"
fi

# 4. The main job on the device: demo data, 30% noise, `fit` (vanilla), eval.
pairs=$([ -n "$quick" ] && echo 300 || echo 2000)
device=$([ -n "$cpu_only" ] && echo cpu || echo cuda)
e2e=$out/e2e
mkdir -p "$e2e"
say "fit on the demo ($pairs pairs, --device $device)"
e2e_start=$(date +%s.%N)
if "$bin" demo --out "$e2e" --pairs "$pairs" --seed 0 >/dev/null \
  && "$bin" corrupt "$e2e/demo.parquet" --rate 0.3 --seed 1 --out "$e2e/noisy.parquet" >/dev/null \
  && timeout 90 "$bin" fit "$e2e/noisy.parquet" --method vanilla --out-dir "$e2e/run" --seed 0 \
       --device "$device" > "$e2e/fit.json" 2> "$e2e/fit.log" \
  && "$bin" eval --labels "$e2e/run/labels.parquet" --truth "$e2e/noisy.parquet" > "$e2e/eval.txt"; then
  python3 - "$out/e2e.json" "$e2e" "$e2e_start" "$device" <<'PY'
import json, re, sys, time
out, d, start, device = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
fit = json.load(open(f"{d}/fit.json"))
text = open(f"{d}/eval.txt").read()
auroc = re.search(r"AUROC \(1 - clean_prob, noisy class\): ([0-9.]+)", text)
json.dump({"device": device, "rows": fit.get("rows"), "train_seconds": fit.get("train_seconds"),
           "score_pairs_per_second": fit.get("score_pairs_per_second"),
           "auroc": float(auroc.group(1)) if auroc else None,
           "seconds": time.time() - start}, open(out, "w"), indent=1)
PY
else
  say "the demo fit failed or ran past 90 s; the end of its log:"
  tail -n 8 "$e2e/fit.log" >&2 2>/dev/null
  echo '{"skipped": "the demo fit failed or ran past 90 s"}' > "$out/e2e.json"
fi
rm -rf "$e2e"

# 5. One JSON, one table.
python3 "$here/scripts/device_check.py" report "$out" || exit 1
say "wrote $out/device_check.json and $out/device_check.md"
cat "$out/device_check.md"
exit "$rc"
