"""Caption-level noise for benchmarks: replace a share of the captions with
web boilerplate (file names, "stock photo", shop and copyright lines).

`ncclean corrupt` moves images between pairs (random or similar-scene
noise). Scraped data also holds captions that describe no image at all:
alt text that is a file name, a shop's template, a licence line. Such a
caption matches its own image no better than any other image, but it is
not a caption of another photo either, so random pairings of the data's
own captions are not its model. This script makes a file of that kind, with
the same `noisy` ground-truth column as `corrupt`, so that `ncclean fit`
and `ncclean eval --truth-col noisy` measure it (BENCHMARKS.md,
"Boilerplate captions").

Usage:
  python examples/boilerplate_noise.py IN.parquet OUT.parquet [--rate 0.2] [--seed 0]
      [--caption-col caption]

The chosen rows (round(rate * rows), drawn with numpy's PCG64 from --seed)
get one of the templates below, with a random number where it has a slot,
so most strings are distinct. Every other column is kept; an existing
`noisy` column is replaced. Needs numpy and pyarrow.
"""

import argparse
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

TEMPLATES = [
    "IMG_{}.JPG",
    "DSC{}.jpg",
    "photo {}",
    "Click to enlarge",
    "stock photo",
    "untitled",
    "image {}",
    "Download free HD wallpaper {}",
    "Product #{} - buy now",
    "Copyright 2014 all rights reserved",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--rate", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--caption-col", default="caption")
    a = ap.parse_args()
    if not 0.0 <= a.rate <= 1.0:
        sys.exit(f"--rate must be between 0 and 1, got {a.rate}")
    table = pq.read_table(a.input)
    if a.caption_col not in table.schema.names:
        sys.exit(
            f"{a.input}: no column {a.caption_col!r} (columns: {table.schema.names}); "
            "name the caption column with --caption-col"
        )
    n = table.num_rows
    rng = np.random.default_rng(a.seed)
    chosen = rng.choice(n, size=int(round(a.rate * n)), replace=False)
    captions = table[a.caption_col].to_pylist()
    noisy = np.zeros(n, dtype=bool)
    for i in chosen:
        template = TEMPLATES[rng.integers(len(TEMPLATES))]
        captions[i] = template.format(rng.integers(1000, 99999))
        noisy[i] = True
    at = table.schema.get_field_index(a.caption_col)
    table = table.set_column(at, a.caption_col, pa.array(captions, pa.string()))
    if "noisy" in table.schema.names:
        table = table.drop(["noisy"])
    table = table.append_column("noisy", pa.array(noisy))
    # Written beside the output and renamed: an interrupt leaves no half file.
    tmp = a.output + ".partial"
    pq.write_table(table, tmp)
    os.replace(tmp, a.output)
    print(f"{a.output}: {n} rows, {int(noisy.sum())} captions replaced by boilerplate")


if __name__ == "__main__":
    main()
