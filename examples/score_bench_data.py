#!/usr/bin/env python3
"""Precomputed-embedding pairs for the scoring benchmark (bench_score_speed.sh).

    python3 examples/score_bench_data.py OUT.parquet [--rows 200000] [--dim 512] [--noise 0.2]

LAION's layout (docs/embeddings.md): `key`, `img_emb`, `text_emb` (both
FixedSizeList<float32>[dim]), `caption`, and `noisy` (the truth, for `eval`).
Every row shows its own image: an image is a scene prototype (one of
`rows / 50`) plus its own variation; its caption embedding is a fixed linear
map of the same latent plus noise. A share `--noise` of the rows takes the
caption (text embedding and text) of another random row. Deterministic
(numpy's PCG64 from `--seed`). Needs numpy and pyarrow.
"""
import argparse

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--noise", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    n, d = a.rows, a.dim
    scenes = max(n // 50, 1)
    protos = rng.standard_normal((scenes, d), dtype=np.float32)
    mix = (rng.standard_normal((d, d), dtype=np.float32) / np.sqrt(d)).astype(np.float32)
    img = np.empty((n, d), np.float32)
    txt = np.empty((n, d), np.float32)
    scene = rng.integers(0, scenes, n)
    step = 20_000
    for s in range(0, n, step):
        e = min(n, s + step)
        z = protos[scene[s:e]] + 0.7 * rng.standard_normal((e - s, d), dtype=np.float32)
        img[s:e] = z + 0.3 * rng.standard_normal((e - s, d), dtype=np.float32)
        txt[s:e] = z @ mix + 0.3 * rng.standard_normal((e - s, d), dtype=np.float32)
    noisy = rng.random(n) < a.noise
    src = np.arange(n)
    donors = rng.integers(0, n, noisy.sum())
    src[noisy] = donors
    noisy &= scene[src] != scene  # a caption of the same scene is no mismatch
    txt = txt[src]
    captions = [f"scene {scene[j]} caption {j}" for j in src]
    flat = lambda m: pa.FixedSizeListArray.from_arrays(pa.array(m.ravel()), d)
    table = pa.table(
        {
            "key": pa.array([f"{i:07d}" for i in range(n)]),
            "img_emb": flat(img),
            "text_emb": flat(txt),
            "caption": pa.array(captions),
            "noisy": pa.array(noisy),
        }
    )
    pq.write_table(table, a.out, row_group_size=16_384)


if __name__ == "__main__":
    main()
