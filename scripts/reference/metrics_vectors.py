#!/usr/bin/env python3
"""Reference vectors for ncclean's detection metrics (src/curation/metrics.rs).

Computes scikit-learn's roc_auc_score, average_precision_score and
precision_recall_fscore_support (binary, zero_division=0) on a few seeded
random datasets with many tied scores, and writes them as JSON.

Usage: python scripts/reference/metrics_vectors.py [OUT.json]
Needs numpy and scikit-learn.
"""

import json
import sys
from pathlib import Path

import numpy as np
from sklearn.metrics import (
    average_precision_score,
    precision_recall_fscore_support,
    roc_auc_score,
)

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "src/curation/testdata/metrics_vectors.json"


def make_cases():
    """(name, scores, labels, predicted). Scores are rounded to few decimals
    so that ties are common and every value parses back exactly."""
    cases = []

    rng = np.random.default_rng(1)
    labels = rng.random(20) < 0.4
    scores = np.round(rng.random(20) * 0.6 + 0.3 * labels, 1)
    cases.append(("tiny_n20_one_decimal", scores, labels, scores >= 0.5))

    rng = np.random.default_rng(2)
    labels = rng.random(200) < 0.3
    scores = np.round(rng.normal(0.0, 1.0, 200) + 1.0 * labels, 2)
    cases.append(("n200_two_decimals", scores, labels, rng.random(200) < 0.3))

    # Integer scores 0..10: heavy ties, 10% positives.
    rng = np.random.default_rng(3)
    labels = rng.random(1000) < 0.1
    scores = np.clip(np.round(rng.normal(4.0, 2.0, 1000) + 2.0 * labels), 0, 10)
    cases.append(("n1000_integer_scores", scores, labels, scores >= 7))

    # Mostly positive, negative-valued scores; nothing predicted positive, so
    # precision is 0/0 and falls back to 0.
    rng = np.random.default_rng(4)
    labels = rng.random(500) < 0.8
    scores = np.round(-rng.gamma(2.0, 1.0, 500) + 0.8 * labels, 3)
    cases.append(("n500_zero_division", scores, labels, np.zeros(500, dtype=bool)))

    return cases


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    rows = []
    for name, scores, labels, predicted in make_cases():
        labels = labels.astype(bool)
        predicted = predicted.astype(bool)
        p, r, f, _ = precision_recall_fscore_support(
            labels, predicted, average="binary", zero_division=0
        )
        rows.append(
            {
                "name": name,
                "scores": [float(s) for s in scores],
                "labels": [bool(v) for v in labels],
                "predicted": [bool(v) for v in predicted],
                "roc_auc": float(roc_auc_score(labels, scores)),
                "average_precision": float(average_precision_score(labels, scores)),
                "precision": float(p),
                "recall": float(r),
                "f1": float(f),
            }
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, separators=(",", ":")) + "\n")
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
