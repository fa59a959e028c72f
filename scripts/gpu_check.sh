#!/usr/bin/env bash
# One command for a GPU machine (issue #13): CPU-vs-CUDA parity of
# MobileNetV2, MiniLM and a CLIP ViT-B/32-shaped tower on 64 inputs (f32,
# f16, bf16 against the CPU's f32), JPEG/PNG decode rate, tower throughput at
# batch 256 in f32 and f16, and seconds per epoch of vanilla and gsc on a
# generated 30k-pair embedding dataset; everything in one JSON file.
#
#   bash scripts/gpu_check.sh BINARY [--cpu-only] [--quick] [--out FILE]
#
#   BINARY      an ncclean built by scripts/build_cuda.sh (its cuda-libs/ beside it)
#   --cpu-only  measure the CPU instead (any build; CI runs this with --quick)
#   --quick     small sizes: seconds instead of minutes
#   --out FILE  where the JSON goes (default: gpu_check.json)
#
# Parity uses the real MobileNetV2 (../shared/models/mobilenet_v2) and MiniLM
# (scripts/fetch_minilm.sh's cache) when present, "skipped: not found"
# otherwise; throughput uses random weights. Exit status: 0 all parity checks
# within tolerance, 4 a tower outside it (the JSON says which), 2 no CUDA
# device without --cpu-only.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:?usage: gpu_check.sh BINARY [--cpu-only] [--quick] [--out FILE]}
shift
out=gpu_check.json
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-only|--quick) args+=("$1"); shift ;;
    --out) out=${2:?--out needs a file}; shift 2 ;;
    *) echo "gpu_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "gpu_check.sh: $bin is not an executable ncclean" >&2; exit 2; }
mobilenet=${NCCLEAN_SHARED:-$here/../shared}/models/mobilenet_v2/model.safetensors
[ -f "$mobilenet" ] && args+=(--mobilenet "$mobilenet")
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2 || true
fi
"$bin" gpu-check --json "$out" "${args[@]}"
echo "gpu_check.sh: wrote $out" >&2
