#!/usr/bin/env bash
# Graded agreement, calibration and transfer (issues #31 and #32;
# METHODS.md section 6). For each method, noise setting and configuration:
# fit on Flickr8k train with injected noise, then
# - graded: score the graded pairs built from the test split
#   (examples/graded_build.rs: each test image with its own caption,
#   captions of its nearest images at ranks 1/3/10/30 and random ones;
#   relevance = mean MiniLM cosine to the image's other captions) and
#   report Kendall tau-b / Spearman of clean_prob and similarity with the
#   relevance, and the AUC of the top vs bottom third;
# - calibration: on the training pairs, AUROC, mean clean_prob against the
#   true clean share, ECE, and the noise estimate;
# - transfer: score the dev split with the same kind of noise injected
#   (seed 5), pairs the model never saw: AUROC, mean clean_prob, ECE.
# Also the ridge reference (examples/reference/ridge_numpy.py) on the same
# pairs. Prints markdown rows and appends them to $out/graded/rows.md.
#
# Needs Flickr8k in ../shared, MiniLM (scripts/fetch_minilm.sh), numpy,
# pyarrow and scipy (pip install numpy pyarrow scipy). The first run builds
# the data and encodes the features (about 10 min on 2 cores).
# Usage: bash examples/bench_graded.sh [METHODS...]   (default: ridge vanilla esc gsc crcl)
# Environment:
#   NOISES   MODE-RATE settings (default "random-0.2")
#   CONFIGS  "config" (examples/configs/flickr8k.toml), "shipped" (the
#            presets, no flags) or both (default "config")
#   FIT_ARGS extra `ncclean fit` arguments
#   LABEL    suffix of run directories and row labels
set -euo pipefail
cd "$(dirname "$0")/.."
methods=("$@"); [ ${#methods[@]} -gt 0 ] || methods=(ridge vanilla esc gsc crcl)
read -ra noises <<< "${NOISES:-random-0.2}"
read -ra configs <<< "${CONFIGS:-config}"
read -ra fit_args <<< "${FIT_ARGS:-}"
label=${LABEL:-}
shared=${NCCLEAN_SHARED:-../shared}
out=target/flickr8k
cache=$out/cache
[ -d "$shared/data/flickr8k" ] || { echo "no $shared/data/flickr8k: set NCCLEAN_SHARED (skipped)" >&2; exit 0; }
python3 -c "import numpy, pyarrow, scipy" 2>/dev/null || { echo "needs numpy, pyarrow and scipy: pip install numpy pyarrow scipy" >&2; exit 2; }
bash scripts/fetch_minilm.sh >/dev/null
cargo build --quiet --bin ncclean --example flickr8k_build --example graded_build
mkdir -p "$out/graded"
# A private copy: rebuilding the workspace during a run must not swap the binary.
bin=$out/graded/ncclean-bench${label:+-$label}
cp target/debug/ncclean "$bin"
[ -f "$out/test.parquet" ] || target/debug/examples/flickr8k_build "$shared/data/flickr8k" "$out"
graded=$out/graded/graded-test.parquet
[ -f "$graded" ] || target/debug/examples/graded_build "$out/test.parquet" "$graded"
towers=(--image-encoder mobilenet_v2 --image-model "$shared/models/mobilenet_v2/model.safetensors" --text-encoder minilm --cache-dir "$cache")

# noisy FILE-STEM MODE RATE SEED: the split with noise injected (made once).
noisy() {
  local split=$1 mode=$2 rate=$3 seed=$4 f
  f=$out/$split-$mode-$rate-s$seed.parquet
  if [ "$rate" = 0 ] || [ "$rate" = 0.0 ]; then
    f=$out/$split-clean.parquet
    [ -f "$f" ] || $bin corrupt "$out/$split.parquet" --rate 0 --seed "$seed" --out "$f" >/dev/null
  else
    [ -f "$f" ] || $bin corrupt "$out/$split.parquet" --mode "$mode" --rate "$rate" --seed "$seed" --out "$f" >/dev/null
  fi
  echo "$f"
}

for spec in "${noises[@]}"; do
  mode=${spec%-*} rate=${spec##*-}
  train=$(noisy train "$mode" "$rate" 0)
  dev=$(noisy dev "$mode" "$rate" 5)
  for m in "${methods[@]}"; do
    for c in "${configs[@]}"; do
      name=$m-$c${label:+-$label}
      run=$out/graded/$name-$mode-$rate
      if [ "$m" = ridge ]; then
        [ "$c" = config ] || continue
        r=$(python3 examples/reference/ridge_numpy.py "$train" --cache-dir "$cache" --graded "$graded")
        python3 - "$r" "$mode" "$rate" <<'PY'
import json, sys
r, mode, rate = json.loads(sys.argv[1]), sys.argv[2], float(sys.argv[3])
g = r["graded"]
print(f"| ridge (reference) | – | {mode} {rate:.0%} | {g['kendall']*100:.1f} | – | {g['spearman']*100:.1f} | – | – | {r['auroc']:.4f} | – | – | – | – | – | – | – |")
PY
        continue
      fi
      cfg=()
      [ "$c" = config ] && cfg=(--config examples/configs/flickr8k.toml)
      start=$(date +%s.%N)
      $bin fit "$train" --method "$m" --out-dir "$run" --force "${towers[@]}" "${cfg[@]}" --seed 0 "${fit_args[@]}" >/dev/null 2>"$run.log"
      wall=$(python3 -c "import time; print(time.time() - $start)")
      $bin score "$graded" --checkpoint "$run" --cache-dir "$cache" --out "$run/graded-labels.parquet" 2>>"$run.log" >/dev/null
      $bin score "$dev" --checkpoint "$run" --cache-dir "$cache" --out "$run/dev-labels.parquet" 2>>"$run.log" >/dev/null
      g=$($bin eval --labels "$run/graded-labels.parquet" --truth "$graded" --truth-col relevance --json)
      if [ "$rate" = 0 ]; then
        # Clean data: no noisy class, so no AUROC; calibration still reads.
        t=$($bin eval --labels "$run/labels.parquet" --truth "$train" --json)
        d=$($bin eval --labels "$run/dev-labels.parquet" --truth "$dev" --json)
      else
        t=$($bin eval --labels "$run/labels.parquet" --truth "$train" --json)
        d=$($bin eval --labels "$run/dev-labels.parquet" --truth "$dev" --json)
      fi
      python3 - "$m" "$c" "$mode" "$rate" "$g" "$t" "$d" "$wall" <<'PY'
import json, sys
m, c, mode, rate, g, t, d, wall = sys.argv[1:]
g, t, d = json.loads(g), json.loads(t), json.loads(d)
f = lambda v, k=100, p=1: "–" if v is None else f"{v*k:.{p}f}"
a = lambda v: "–" if v is None else f"{v:.4f}"
print(f"| {m} | {c} | {mode} {float(rate):.0%} | {f(g['kendall_clean_prob'])} | {f(g['kendall_similarity'])} "
      f"| {f(g['spearman_clean_prob'])} | {f(g['spearman_similarity'])} | {a(g['auc_clean_prob'])} "
      f"| {a(t['auroc'])} | {a(d['auroc'])} | {t['mean_clean_prob']:.3f} ({t['clean_share']:.2f}) "
      f"| {d['mean_clean_prob']:.3f} ({d['clean_share']:.2f}) | {a(t['calibration_error'])} | {a(d['calibration_error'])} "
      f"| {1 - t['mean_clean_prob']:.3f} | {float(wall):.0f} |")
PY
    done
  done
done | tee -a "$out/graded/rows.md"
echo "columns: method | config | noise | tau-b clean_prob | tau-b similarity | rho clean_prob | rho similarity | AUC top/bottom clean_prob | AUROC train | AUROC dev | mean clean_prob train (truth) | dev (truth) | ECE train | ECE dev | noise estimate | fit s" >&2
