#!/usr/bin/env bash
# Labels of every method, for comparing a refactor's outputs with the code
# before it (max |Δ| of clean_prob, soft_label, similarity must be 0).
#
#   bash scripts/compare_runs.sh run BIN OUT_DIR demo|flickr8k [METHODS...]
#       fits every method with BIN (an ncclean binary; copy it first so a
#       rebuild cannot swap it) and copies each labels.parquet to
#       OUT_DIR/<method>.parquet.
#         demo:     2,000 demo pairs, 30% noise (corrupt seed 1), fit seed 3,
#                   examples/configs/demo.toml;
#         flickr8k: Flickr8k train with 20% noise, MobileNetV2 + MiniLM,
#                   examples/configs/flickr8k.toml, seed 0 (needs ../shared
#                   and MiniLM; run examples/flickr8k.sh once to build the data).
#   bash scripts/compare_runs.sh compare DIR_A DIR_B
#       prints max |Δ| per method and column (examples/compare_labels.rs);
#       exits 1 when anything differs.
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=${1:?usage: compare_runs.sh run|compare ...}
shift
case "$cmd" in
  compare)
    cargo run --quiet --example compare_labels -- "$@"
    ;;
  run)
    bin=$(realpath "${1:?binary}") out=${2:?out dir} kind=${3:?demo or flickr8k}
    shift 3
    methods=("$@"); [ ${#methods[@]} -gt 0 ] || methods=(vanilla esc gsc crcl recon)
    mkdir -p "$out"
    work="$out/work"
    mkdir -p "$work"
    case "$kind" in
      demo)
        [ -f "$work/noisy.parquet" ] || {
          "$bin" demo --out "$work" --pairs 2000 --seed 0 >/dev/null
          "$bin" corrupt "$work/demo.parquet" --rate 0.3 --seed 1 --out "$work/noisy.parquet" >/dev/null
        }
        data="$work/noisy.parquet" seed=3 extra=(--config examples/configs/demo.toml)
        ;;
      flickr8k)
        shared=${NCCLEAN_SHARED:-../shared}
        data=target/flickr8k/train-noisy-0.2.parquet seed=0
        [ -f "$data" ] || { echo "no $data: run bash examples/flickr8k.sh vanilla 0.2 first" >&2; exit 3; }
        extra=(--config examples/configs/flickr8k.toml --image-encoder mobilenet_v2
          --image-model "$shared/models/mobilenet_v2/model.safetensors" --text-encoder minilm
          --cache-dir target/flickr8k/cache)
        ;;
      *) echo "unknown data kind $kind (demo or flickr8k)" >&2; exit 2 ;;
    esac
    for m in "${methods[@]}"; do
      "$bin" fit "$data" --method "$m" --out-dir "$work/run-$m" --seed "$seed" "${extra[@]}" >/dev/null 2>"$work/$m.log"
      cp "$work/run-$m/labels.parquet" "$out/$m.parquet"
      echo "$m: $out/$m.parquet"
    done
    ;;
  *) echo "usage: compare_runs.sh run|compare ..." >&2; exit 2 ;;
esac
