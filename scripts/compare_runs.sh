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
#       Beside the labels it keeps, under OUT_DIR/summaries/, what must
#       not change either: each fit's stdout summary and stats.json (timing
#       fields removed), checkpoint/threshold.json, and on the demo the
#       stdout summaries of demo, corrupt, inspect --json, score (plain and
#       --refit, with its labels), filter (default and --keep-fraction) and
#       eval --json of every method's labels.
#   bash scripts/compare_runs.sh compare DIR_A DIR_B
#       prints max |Δ| per method and column (examples/compare_labels.rs),
#       then diffs the two summaries/ folders; exits 1 when anything differs.
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=${1:?usage: compare_runs.sh run|compare ...}
shift
case "$cmd" in
  compare)
    a=${1:?dir a} b=${2:?dir b}
    status=0
    cargo run --quiet --example compare_labels -- "$a" "$b" || status=1
    if [ -d "$a/summaries" ] || [ -d "$b/summaries" ]; then
      if diff -r "$a/summaries" "$b/summaries"; then
        echo "summaries: identical ($(ls "$a/summaries" | wc -l) files)"
      else
        echo "summaries: DIFFER"; status=1
      fi
    fi
    exit $status
    ;;
  run)
    bin=$(realpath "${1:?binary}") out=${2:?out dir} kind=${3:?demo or flickr8k}
    shift 3
    methods=("$@"); [ ${#methods[@]} -gt 0 ] || methods=(vanilla esc gsc crcl recon)
    mkdir -p "$out"
    work="$out/work"
    sums="$out/summaries"
    mkdir -p "$work" "$sums"
    # Drop the fields that measure time (they differ between any two runs)
    # and those that name the binary or its build (ncclean_build, command),
    # or digest a file that holds the output folder's path (output_digest:
    # the labels themselves are compared above).
    untimed() {
      python3 -c 'import json,sys
v=json.load(open(sys.argv[1]))
def strip(x):
    if isinstance(x,dict):
        return {k:strip(w) for k,w in x.items() if k not in ("command","ncclean_build","output_digest") and not any(t in k for t in ("seconds","per_second","elapsed","_ms","timing","started","finished","created"))}
    if isinstance(x,list):
        return [strip(w) for w in x]
    return x
print(json.dumps(strip(v),indent=1,sort_keys=False))' "$1"
    }
    case "$kind" in
      demo)
        [ -f "$work/noisy.parquet" ] || {
          "$bin" demo --out "$work" --pairs 2000 --seed 0 >"$sums/demo.stdout"
          "$bin" corrupt "$work/demo.parquet" --rate 0.3 --seed 1 --out "$work/noisy.parquet" >"$sums/corrupt.stdout"
        }
        "$bin" inspect "$work/noisy.parquet" --json >"$sums/inspect.json"
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
      run="$work/run-$m"
      "$bin" fit "$data" --method "$m" --out-dir "$run" --seed "$seed" "${extra[@]}" >"$work/$m.fit.stdout" 2>"$work/$m.log"
      cp "$run/labels.parquet" "$out/$m.parquet"
      untimed "$work/$m.fit.stdout" >"$sums/$m.fit.json"
      untimed "$run/stats.json" >"$sums/$m.stats.json"
      untimed "$run/run.json" >"$sums/$m.run.json"
      cp "$run/checkpoint/threshold.json" "$sums/$m.threshold.json"
      if [ "$kind" = demo ]; then
        "$bin" eval --labels "$run/labels.parquet" --truth "$data" --json >"$sums/$m.eval.json"
        "$bin" filter "$data" --labels "$run/labels.parquet" --out "$work/$m.filtered.parquet" >"$sums/$m.filter.stdout"
        "$bin" filter "$data" --labels "$run/labels.parquet" --keep-fraction 0.6 --out "$work/$m.filtered-k.parquet" >"$sums/$m.filter-k.stdout"
        "$bin" filter "$data" --labels "$run/labels.parquet" --out-dir "$work/$m.filtered-dir" >"$sums/$m.filter-dir.stdout"
        "$bin" score "$data" --checkpoint "$run" --out-dir "$work/score-$m" >"$work/$m.score.stdout" 2>>"$work/$m.log"
        untimed "$work/$m.score.stdout" >"$sums/$m.score.json"
        untimed "$work/score-$m/noisy.done.json" >"$sums/$m.score-done.json"
        cp "$work/score-$m/noisy.parquet" "$out/$m-score.parquet"
        "$bin" score "$data" --checkpoint "$run" --refit --out "$work/refit-$m.parquet" >"$work/$m.refit.stdout" 2>>"$work/$m.log"
        untimed "$work/$m.refit.stdout" >"$sums/$m.refit.json"
        cp "$work/refit-$m.parquet" "$out/$m-refit.parquet"
      fi
      echo "$m: $out/$m.parquet"
    done
    # The output folder's own path is no difference.
    abs=$(realpath "$out")
    sed -i "s#$abs#OUT#g; s#$out#OUT#g" "$sums"/*
    ;;
  *) echo "usage: compare_runs.sh run|compare ..." >&2; exit 2 ;;
esac
