"""Image-level noise for benchmarks: put a share of the pairs on a few
placeholder images.

Scraped data holds images that fit no caption: an "image not available"
thumbnail, a shop's logo, a stock photo, each shown with many unrelated
captions. Such a pair matches no better than a random pairing, but its
similarities are bunched (a placeholder fits every caption about equally),
so it is not like the random pairings' lower tail either. This script
makes a file of that kind, with the same `noisy` ground-truth column as
`ncclean corrupt`, so that `ncclean fit` and `ncclean eval --truth-col
noisy` measure it (BENCHMARKS.md, "Placeholder images";
`examples/boilerplate_noise.py` is the caption-side counterpart).

Usage:
  python examples/placeholder_noise.py IN.parquet OUT.parquet --from OTHER.parquet
      [--rate 0.2] [--seed 0] [--images 5] [--image-col image]

The chosen rows (round(rate * rows), drawn with numpy's PCG64 from --seed)
get, in turn, one of the first --images distinct images of OTHER.parquet's
image column (in file order; use a split the fit never sees, so that the
placeholders are only ever shown with captions they do not describe).
Every other column is kept; an existing `noisy` column is replaced. Needs
numpy and pyarrow.
"""

import argparse
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--from", dest="source", required=True,
                    help="parquet file whose first distinct images are the placeholders")
    ap.add_argument("--rate", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--images", type=int, default=5)
    ap.add_argument("--image-col", default="image")
    a = ap.parse_args()
    if not 0.0 <= a.rate <= 1.0:
        print(f"error: --rate {a.rate} is not in [0, 1]", file=sys.stderr)
        return 2
    if a.images < 1:
        print(f"error: --images {a.images}: at least one placeholder is needed", file=sys.stderr)
        return 2
    table = pq.read_table(a.input)
    if a.image_col not in table.column_names:
        print(f"error: {a.input} has no column {a.image_col!r} (columns: "
              f"{', '.join(table.column_names)}); name it with --image-col", file=sys.stderr)
        return 2
    source = pq.read_table(a.source, columns=[a.image_col])
    placeholders = []
    for b in source.column(a.image_col).to_pylist():
        if b is not None and b not in placeholders:
            placeholders.append(b)
        if len(placeholders) == a.images:
            break
    if len(placeholders) < a.images:
        print(f"error: {a.source} holds {len(placeholders)} distinct images, "
              f"fewer than --images {a.images}", file=sys.stderr)
        return 2
    n = table.num_rows
    rng = np.random.default_rng(a.seed)
    rows = rng.choice(n, round(a.rate * n), replace=False)
    images = table.column(a.image_col).to_pylist()
    noisy = np.zeros(n, dtype=bool)
    for j, i in enumerate(rows):
        images[i] = placeholders[j % len(placeholders)]
        noisy[i] = True
    at = table.column_names.index(a.image_col)
    field = table.schema.field(at)
    table = table.set_column(at, field, pa.array(images, type=field.type))
    if "noisy" in table.column_names:
        table = table.drop_columns(["noisy"])
    table = table.append_column("noisy", pa.array(noisy))
    # Written beside the target and renamed: an interrupt leaves the old
    # file or the new one, never half of one.
    tmp = a.output + ".tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, a.output)
    print(f"put {len(rows)} of {n} pairs on {len(placeholders)} placeholder images "
          f"(seed {a.seed}); {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
