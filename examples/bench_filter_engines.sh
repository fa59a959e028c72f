#!/usr/bin/env bash
# `filter --engine native` against `--engine polars`: wall time and peak
# memory on the same input, as given and resharded (shuffled into 4 files),
# and a check with pyarrow (an independent reader) that both engines wrote
# the same table.
#
#   bash examples/bench_filter_engines.sh NATIVE_BIN POLARS_BIN DATA.parquet LABELS.parquet [RULE...]
#
# NATIVE_BIN: any ncclean build; POLARS_BIN: one built with
# `cargo build --release --features polars`. RULE: filter flags such as
# `--min-prob 0.5` (default: the labels' is_clean). Needs python3 with
# pyarrow and GNU time. Prints a markdown table on stdout.
set -euo pipefail
if [ $# -lt 4 ]; then
  sed -n 2,12p "$0"
  exit 2
fi
native=$1 polars=$2 data=$3 labels=$4
shift 4
rule=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 - "$data" "$work/reshard" <<'EOF'
import os, sys
import pyarrow as pa, pyarrow.parquet as pq
t = pq.read_table(sys.argv[1])
os.makedirs(sys.argv[2])
# A fixed shuffle (a stride coprime with the row count), into 4 files.
n = t.num_rows
step = next(s for s in range(7919, n + 7919) if n % s != 0 and all(s % p for p in range(2, int(s ** 0.5) + 1)))
order = pa.array([(i * step) % n for i in range(n)])
t = t.take(order)
q = (n + 3) // 4
for k in range(4):
    pq.write_table(t.slice(k * q, q), os.path.join(sys.argv[2], f"part-{k}.parquet"))
EOF

run() { # name bin input out extra...
  local name=$1 bin=$2 input=$3 out=$4
  shift 4
  /usr/bin/time -f "%e %M" -o "$work/$name.time" \
    "$bin" filter "$input" --labels "$labels" --out "$out" "${rule[@]}" "$@" \
    >/dev/null 2>"$work/$name.log" || { cat "$work/$name.log" >&2; exit 1; }
  read -r wall kb <"$work/$name.time"
  printf '%s %s\n' "$wall" "$((kb / 1024))"
}

echo "| input | engine | wall s (run 1, run 2) | peak RSS MB | rows out |"
echo "|---|---|---|---|---|"
for input in "$data" "$work/reshard"; do
  label=$([ "$input" = "$data" ] && echo "as given" || echo "resharded (4 files, shuffled)")
  for engine in native polars; do
    bin=$native
    extra=()
    if [ "$engine" = polars ]; then bin=$polars; extra=(--engine polars); fi
    out="$work/$engine.parquet"
    read -r w1 m1 < <(run "$engine-1" "$bin" "$input" "$out" "${extra[@]}")
    read -r w2 m2 < <(run "$engine-2" "$bin" "$input" "$out" "${extra[@]}")
    rows=$(python3 -c "import pyarrow.parquet as pq,sys; print(pq.ParquetFile(sys.argv[1]).metadata.num_rows)" "$out")
    echo "| $label | $engine | $w1, $w2 | $(( m1 > m2 ? m1 : m2 )) | $rows |"
  done
  python3 - "$work/native.parquet" "$work/polars.parquet" <<'EOF'
import sys
import pyarrow as pa, pyarrow.parquet as pq
a, b = (pq.read_table(p) for p in sys.argv[1:3])
assert a.column_names == b.column_names, (a.column_names, b.column_names)
assert a.num_rows == b.num_rows, (a.num_rows, b.num_rows)
for name in a.column_names:
    x, y = a[name], b[name]
    # polars writes large strings and binaries: compare values, not types.
    if pa.types.is_large_string(y.type) or pa.types.is_large_binary(y.type):
        y = y.cast(x.type)
    assert x.equals(y), name
print(f"same table: {a.num_rows} rows, {len(a.column_names)} columns", file=sys.stderr)
EOF
done
