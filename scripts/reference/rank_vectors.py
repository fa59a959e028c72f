#!/usr/bin/env python3
"""Reference vectors for ncclean's rank correlations (src/curation/metrics.rs).

Computes scipy's kendalltau (tau-b, the default) and spearmanr on a few
seeded random datasets with many ties (ratings on a 1-5 scale, scores
rounded to few decimals) and writes them as JSON.

Usage: python scripts/reference/rank_vectors.py [OUT.json]
Needs numpy and scipy.
"""

import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau, spearmanr

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "src/curation/testdata/rank_vectors.json"


def make_cases():
    """(name, x, y): values rounded so that ties are common and every value
    parses back exactly."""
    cases = []
    rng = np.random.default_rng(7)
    truth = rng.integers(1, 6, 30).astype(float)
    cases.append(("ratings_n30", np.round(truth * 0.2 + rng.normal(0, 0.3, 30), 1), truth))
    rng = np.random.default_rng(8)
    x = rng.normal(0, 1, 500)
    cases.append(("n500_two_decimals", np.round(x, 2), np.round(x + rng.normal(0, 1, 500), 1)))
    rng = np.random.default_rng(9)
    x = rng.integers(0, 4, 200).astype(float)
    cases.append(("n200_heavy_ties", x, np.round(-x + rng.integers(0, 3, 200), 0)))
    return cases


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    rows = []
    for name, x, y in make_cases():
        rows.append({
            "name": name,
            "x": [float(v) for v in x],
            "y": [float(v) for v in y],
            "kendall_tau_b": float(kendalltau(x, y).statistic),
            "spearman": float(spearmanr(x, y).statistic),
        })
    out.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wrote {len(rows)} cases to {out}")


if __name__ == "__main__":
    main()
