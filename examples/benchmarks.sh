#!/usr/bin/env bash
# The headline of BENCHMARKS.md: the default method first, then every
# method, at 20% and 50% injected noise on Flickr8k train (frozen
# MobileNetV2 + MiniLM features, cached), detection on the training pairs
# and retrieval on the 1,000-image test split. Writes the table with its
# date, commit, machine and command to target/flickr8k/bench/headline.md
# (paste it at the top of BENCHMARKS.md, the previous headline kept below
# under its own date); it never rewrites BENCHMARKS.md itself.
# Usage: bash examples/benchmarks.sh [METHODS...]   (default: gsc vanilla esc crcl recon)
# Environment: PROFILE release (default) or dev; RATES (default "0.2 0.5");
#   ESC_VARIANTS=1 also runs ESC with the preset's choices put back;
#   SHIPPED=0 leaves out the first method's row "as shipped" (its preset
#   alone, no config file: what `ncclean fit data.parquet` runs).
set -euo pipefail
cd "$(dirname "$0")/.."
methods=("$@"); [ ${#methods[@]} -gt 0 ] || methods=(gsc vanilla esc crcl recon)
read -ra rates <<< "${RATES:-0.2 0.5}"
profile=${PROFILE:-release}
shared=${NCCLEAN_SHARED:-../shared}
out=target/flickr8k
bash scripts/fetch_minilm.sh >/dev/null
# The commit the binary is built from (the table is written at the end, when
# HEAD may have moved on); "+dirty" when the tree had uncommitted changes.
commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!*.md' || echo +dirty)
if [ "$profile" = release ]; then
  cargo build --quiet --release --bin ncclean
  built=target/release/ncclean
else
  # The dev profile optimises dependencies and ncclean-models at -O3 (see
  # Cargo.toml), so it runs near release speed without a second full build.
  cargo build --quiet --bin ncclean
  built=target/debug/ncclean
fi
cargo build --quiet --example flickr8k_build --example graded_build
# A private copy: rebuilding the workspace during a run must not swap the binary.
mkdir -p "$out/bench"
cp "$built" "$out/ncclean-bench"
bin=$out/ncclean-bench
[ -f "$out/test.parquet" ] || target/debug/examples/flickr8k_build "$shared/data/flickr8k" "$out"
graded=$out/graded/graded-test.parquet
mkdir -p "$out/graded"
[ -f "$graded" ] || target/debug/examples/graded_build "$out/test.parquet" "$graded"
towers=(--image-encoder mobilenet_v2 --image-model "$shared/models/mobilenet_v2/model.safetensors" --text-encoder minilm --cache-dir "$out/cache")
[ -x /usr/bin/time ] || { echo "needs GNU time (apt-get install time) for peak memory" >&2; exit 2; }

# run_one LABEL METHOD RATE [FIT ARGS...]: fit, evaluate, print one table row.
run_one() {
  local label=$1 m=$2 rate=$3; shift 3
  local train="$out/train-noisy-$rate.parquet" run="$out/bench/${label// /-}-$rate"
  mkdir -p "$(dirname "$run")"
  local cfg=(--config examples/configs/flickr8k.toml)
  # "... as shipped": the preset alone, no config file (what `ncclean fit data.parquet` does).
  case "$label" in *"as shipped"*) cfg=() ;; esac
  /usr/bin/time -f "%e %M" -o "$run.time" $bin fit "$train" --method "$m" --out-dir "$run" "${towers[@]}" \
    "${cfg[@]}" --seed 0 "$@" >/dev/null 2>"$run.log"
  local wall rss det ret pps grd
  read -r wall rss < "$run.time"
  det=$($bin eval --labels "$run/labels.parquet" --truth "$train" --json)
  ret=$($bin eval --retrieval --checkpoint "$run" "$out/test.parquet" --cache-dir "$out/cache" --json 2>/dev/null)
  pps=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["score_pairs_per_second"]))' "$run/stats.json")
  # Graded agreement: the test split's graded pairs (examples/graded_build.rs,
  # the pairs bench_graded.sh scores), Kendall tau-b with their relevance.
  $bin score "$graded" --checkpoint "$run" --cache-dir "$out/cache" --out "$run/graded-labels.parquet" >/dev/null 2>>"$run.log"
  grd=$($bin eval --labels "$run/graded-labels.parquet" --truth "$graded" --truth-col relevance --json)
  python3 - "$label" "$rate" "$wall" "$rss" "$pps" "$det" "$ret" "$grd" <<'PY'
import json, sys
m, rate, wall, rss, pps, det, ret, grd = sys.argv[1:]
d, r, g = json.loads(det), json.loads(ret), json.loads(grd)
print(f"| {m} | {float(rate):.0%} | {100 * g['kendall_clean_prob']:.1f} ({100 * g['kendall_similarity']:.1f}) "
      f"| {d['mean_clean_prob']:.3f} ({d['clean_share']:.2f}) | {d['calibration_error']:.3f} "
      f"| {d['auroc']:.4f} | {d['ap']:.4f} | {d['f1']:.4f} | {r['rsum']:.1f} | {r['i2t_r1']:.1f} / {r['t2i_r1']:.1f} "
      f"| {float(wall):.0f} | {pps} | {int(rss)/1024:.0f} |")
PY
}

# ESC departs from its preset on frozen features (examples/configs/flickr8k.toml
# says why); these runs put the preset's choices back one at a time.
esc_variants=(
  "esc-bmm-paper-phases|--set mixture=bmm --set params.clean_only_epochs=2"
  "esc-gmm-paper-phases|--set params.clean_only_epochs=2"
  "esc-bmm-clean-only|--set mixture=bmm"
)
rows=()
ablation=()
for rate in "${rates[@]}"; do
  train="$out/train-noisy-$rate.parquet"
  [ -f "$train" ] || $bin corrupt "$out/train.parquet" --rate "$rate" --seed 0 --out "$train" >/dev/null
  for m in "${methods[@]}"; do
    row=$(run_one "$m" "$m" "$rate")
    echo "$row"
    rows+=("$row")
    if [ "$m" = "${methods[0]}" ] && [ "${SHIPPED:-1}" = 1 ]; then
      row=$(run_one "$m as shipped" "$m" "$rate")
      echo "$row"
      rows+=("$row")
    fi
    if [ "$m" = esc ] && [ "${ESC_VARIANTS:-0}" = 1 ]; then
      for v in "${esc_variants[@]}"; do
        read -ra args <<< "${v#*|}"
        row=$(run_one "${v%%|*}" esc "$rate" "${args[@]}")
        echo "$row"
        ablation+=("$row")
      done
    fi
  done
done
{
  echo "## Headline ($(date -u +%Y-%m-%d), commit $commit, $profile build)"
  echo
  echo "Flickr8k, frozen MobileNetV2 (ImageNet) + all-MiniLM-L6-v2 features, trained matching head,"
  echo "noise injected into the 30,000 training pairs (NCR convention, seed 0). Detection: AUROC / AP of"
  echo "1 - clean_prob for the noisy pairs and F1 of is_clean = false, on the training pairs. Graded τb:"
  echo "Kendall τb ×100 of clean_prob (of similarity in brackets) with the relevance of the 7,000 graded"
  echo "test pairs (examples/graded_build.rs: own, neighbours' and random captions; BENCHMARKS.md, graded"
  echo "section). Mean clean_prob (true clean share) and ECE: the training pairs. Retrieval:"
  echo "1,000-image test split (5,000 captions). Fit wall time includes reading the cached features;"
  echo "scoring throughput is fit's final scoring pass; peak memory is the fit process's max RSS."
  echo "Schedules: examples/configs/flickr8k.toml (short, CPU-sized; not the papers' full schedules),"
  echo "except the row \"as shipped\": the preset alone, no config file (\`ncclean fit data.parquet\`)."
  echo "Machine: $(nproc) CPU cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), no GPU."
  echo "Heads: each method's preset (mean projection; ReCon: GPO over the 7×7 MobileNetV2 grid and the"
  echo "MiniLM tokens, loaded from the cache)."
  echo
  echo "Command: \`bash examples/benchmarks.sh ${methods[*]}\` (RATES=\"${rates[*]}\", PROFILE=$profile)."
  echo
  echo "| method | noise | graded τb (sim) | mean clean_prob (truth) | ECE | AUROC | AP | F1 | test rSum | R@1 i→t / t→i | fit s | score pairs/s | peak MB |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  if [ ${#ablation[@]} -gt 0 ]; then
    echo
    echo "ESC with the preset's choices put back (GMM → BMM, the paper's phases), same run:"
    echo
    echo "| run | noise | graded τb (sim) | mean clean_prob (truth) | ECE | AUROC | AP | F1 | test rSum | R@1 i→t / t→i | fit s | score pairs/s | peak MB |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${ablation[@]}"
  fi
} > "$out/bench/headline.md"
echo "wrote $out/bench/headline.md: paste it at the top of BENCHMARKS.md"
