#!/usr/bin/env bash
# Transfer with `fit --sample` (issue #32): fit on a sample of Flickr8k
# train with injected noise, score every training row and the dev split
# through the checkpoint, and compare the labels of three kinds of pairs:
# - trained: the drawn rows (the model trained on them, or held them out to
#   calibrate on);
# - unsampled: training rows outside the sample (same distribution, never
#   seen: what `fit --sample` + `score` labels);
# - dev: the dev split with the same noise (seed 5), images never seen;
# - test: the test split with the same noise (seed 6), images never seen.
# For each: AUROC of 1 - clean_prob for the noisy pairs, mean clean_prob
# against the true clean share, ECE (10 bins), and at the default cut
# (clean_prob >= 0.5) the expected precision (mean clean_prob of the kept
# pairs) against the realised one.
#
# Needs what examples/bench_graded.sh needs (Flickr8k in ../shared, MiniLM,
# numpy and pyarrow); run that once first to build the data and the feature
# cache. Usage: bash examples/bench_transfer.sh [METHODS...] (default gsc)
# Environment: NOISES (default "random-0.2"; also hard-0.2 etc.), SEED fit seed (default 0), SAMPLE
# rows drawn (default 15000, half of train; 0: fit on every row, no --sample), FIT_ARGS extra fit
# arguments (the config is the shipped one: no --config), LABEL run suffix, PROFILE (dev or
# release, default dev).
set -euo pipefail
cd "$(dirname "$0")/.."
methods=("$@"); [ ${#methods[@]} -gt 0 ] || methods=(gsc)
read -ra noises <<< "${NOISES:-random-0.2}"
read -ra fit_args <<< "${FIT_ARGS:-}"
sample=${SAMPLE:-15000}
label=${LABEL:-}
shared=${NCCLEAN_SHARED:-../shared}
out=target/flickr8k
cache=$out/cache
[ -d "$shared/data/flickr8k" ] || { echo "no $shared/data/flickr8k: set NCCLEAN_SHARED (skipped)" >&2; exit 0; }
python3 -c "import numpy, pyarrow" 2>/dev/null || { echo "needs numpy and pyarrow: pip install numpy pyarrow" >&2; exit 2; }
[ -f "$out/train.parquet" ] || { echo "no $out/train.parquet: run examples/bench_graded.sh once first" >&2; exit 2; }
profile=${PROFILE:-dev}
cargo build --quiet --profile "$profile" --bin ncclean
mkdir -p "$out/transfer"
bin=$out/transfer/ncclean-bench${label:+-$label}
dir=$profile; [ "$profile" = dev ] && dir=debug
cp "target/$dir/ncclean" "$bin"
sample_args=(); [ "$sample" = 0 ] || sample_args=(--sample "$sample")
towers=(--image-encoder mobilenet_v2 --image-model "$shared/models/mobilenet_v2/model.safetensors" --text-encoder minilm --cache-dir "$cache")
noisy() {
  local split=$1 mode=$2 rate=$3 seed=$4 f=$out/$1-$2-$3-s$4.parquet
  [ -f "$f" ] || $bin corrupt "$out/$split.parquet" --mode "$mode" --rate "$rate" --seed "$seed" --out "$f" >/dev/null
  echo "$f"
}
for spec in "${noises[@]}"; do
  mode=${spec%-*} rate=${spec##*-}
  train=$(noisy train "$mode" "$rate" 0)
  dev=$(noisy dev "$mode" "$rate" 5)
  test=$(noisy test "$mode" "$rate" 6)
  for m in "${methods[@]}"; do
    run=$out/transfer/$m${label:+-$label}-$mode-$rate-sample$sample
    $bin fit "$train" --method "$m" --out-dir "$run" --force "${sample_args[@]}" "${towers[@]}" \
      --seed "${SEED:-0}" "${fit_args[@]}" >/dev/null 2>"$run.log"
    $bin score "$train" --checkpoint "$run" --cache-dir "$cache" --out "$run/all-labels.parquet" 2>>"$run.log" >/dev/null
    $bin score "$dev" --checkpoint "$run" --cache-dir "$cache" --out "$run/dev-labels.parquet" 2>>"$run.log" >/dev/null
    $bin score "$test" --checkpoint "$run" --cache-dir "$cache" --out "$run/test-labels.parquet" 2>>"$run.log" >/dev/null
    python3 - "$m" "$mode" "$rate" "$sample" "$run" "$train" "$dev" "$test" <<'PY'
import sys
import numpy as np
import pyarrow.parquet as pq
m, mode, rate, sample, run, train, dev, test = sys.argv[1:]

def table(path, cols):
    t = pq.read_table(path, columns=cols)
    return {c: t.column(c).to_pylist() for c in cols}

def truth(path):
    t = table(path, ["key", "noisy"])
    return dict(zip(t["key"], t["noisy"]))

def auroc(score, pos):
    # AUROC of `score` for the positive class, ties counted half.
    order = np.argsort(score, kind="mergesort")
    s = np.asarray(score)[order]
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[i:j + 1] = (i + j) / 2 + 1
        i = j + 1
    r = np.empty(len(s)); r[order] = ranks
    p = np.asarray(pos)
    n1, n0 = p.sum(), (~p).sum()
    if n1 == 0 or n0 == 0:
        return float("nan")
    return (r[p].sum() - n1 * (n1 + 1) / 2) / (n1 * n0)

def row(kind, cp, noisy):
    cp, noisy = np.asarray(cp, dtype=float), np.asarray(noisy, dtype=bool)
    clean = ~noisy
    bins = np.minimum((cp * 10).astype(int), 9)
    ece = sum(abs(cp[bins == b].mean() - clean[bins == b].mean()) * (bins == b).sum()
              for b in range(10) if (bins == b).any()) / len(cp)
    kept = cp >= 0.5
    exp_prec = cp[kept].mean() if kept.any() else float("nan")
    real_prec = clean[kept].mean() if kept.any() else float("nan")
    print(f"| {m} | {mode} {float(rate):.0%} | {sample} | {kind} | {len(cp)} | {auroc(1 - cp, noisy):.4f} "
          f"| {cp.mean():.3f} ({clean.mean():.2f}) | {ece:.4f} | {exp_prec:.3f} / {real_prec:.3f} |")

drawn = set(table(f"{run}/labels.parquet", ["key"])["key"])
tt = truth(train)
a = table(f"{run}/all-labels.parquet", ["key", "ncclean_clean_prob"])
for kind, inside in [("trained (drawn)", True), ("unsampled train", False)]:
    idx = [i for i, k in enumerate(a["key"]) if (k in drawn) == inside]
    if idx:
        row(kind, [a["ncclean_clean_prob"][i] for i in idx], [tt[a["key"][i]] for i in idx])
for kind, path in [("dev", dev), ("test", test)]:
    t = truth(path)
    d = table(f"{run}/{kind}-labels.parquet", ["key", "ncclean_clean_prob"])
    row(kind, d["ncclean_clean_prob"], [t[k] for k in d["key"]])
PY
  done
done | tee -a "$out/transfer/rows.md"
echo "columns: method | noise | sample | pairs | n | AUROC | mean clean_prob (truth) | ECE | at clean_prob >= 0.5: expected / realised precision" >&2
