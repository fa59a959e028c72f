#!/usr/bin/env python3
"""Reference vectors for ncclean's mixture-model division (pipelines/src/division).

The GMM side is scikit-learn's own GaussianMixture with the settings ncclean
mirrors. The BMM side is an independent numpy/scipy implementation written from
METHODS.md section 0, not a port of the Rust code, so that the two can disagree.

Every dataset is generated as float32 (the Rust API takes f32 scores) and then
processed in float64, exactly as the Rust side does. Scores are written as the
exact decimal of their float64 value so that parsing them back is lossless.

Usage: python scripts/reference/mixture_vectors.py [OUT.json]
Needs numpy, scipy and scikit-learn.
"""

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import sklearn
from scipy import special, stats
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture

DEFAULT_OUT = (
    Path(__file__).resolve().parents[2]
    / "pipelines/src/division/testdata/mixture_vectors.json"
)

# Settings from METHODS.md section 0.
GMM_SETTINGS = {"n_components": 2, "max_iter": 10, "tol": 1e-2, "reg_covar": 5e-4}
BMM_CLIP = 1e-4
BMM_ITERS = 10
BMM_TOL = 1e-2  # only for the reported `converged` flag; BMM never stops early


def sig8(x):
    """Round to 8 significant digits; the Rust tests compare within 1e-4."""
    return float(f"{x:.8g}")


def make_datasets():
    """Each entry: (name, float32 scores). Mixtures are chosen so that 1-D
    k-means has one clear answer, which lets sklearn's randomised k-means++
    land on the same partition as ncclean's deterministic min/max start."""
    out = []

    rng = np.random.default_rng(11)
    n = 50
    k = 30
    x = np.concatenate([rng.normal(0.2, 0.04, k), rng.normal(0.75, 0.05, n - k)])
    out.append(("small_bimodal_n50", x))

    rng = np.random.default_rng(12)
    n = 300
    k = int(0.6 * n)
    x = np.concatenate([rng.normal(0.2, 0.05, k), rng.normal(0.8, 0.05, n - k)])
    out.append(("bimodal_separated_n300", rng.permutation(x)))

    rng = np.random.default_rng(13)
    n = 600
    k = n // 2
    x = np.concatenate([rng.normal(0.4, 0.10, k), rng.normal(0.7, 0.08, n - k)])
    out.append(("bimodal_overlapping_n600", rng.permutation(x)))

    # Loss-like: most pairs have a small loss, the mismatched 30% a large one;
    # raw values are not in [0, 1], so the min-max step matters.
    rng = np.random.default_rng(14)
    n = 2000
    k = int(0.7 * n)
    clean = rng.gamma(shape=4.0, scale=0.025, size=k)  # mean 0.1, right-skewed
    noisy = rng.normal(0.7, 0.08, n - k)
    out.append(("skewed_loss_n2000", rng.permutation(np.concatenate([clean, noisy]))))

    # Similarity-like: cosine scores in [-1, 1], the clean majority is high.
    rng = np.random.default_rng(15)
    n = 800
    k = int(0.8 * n)
    x = np.concatenate(
        [np.tanh(rng.normal(0.6, 0.12, k)), np.tanh(rng.normal(0.05, 0.12, n - k))]
    )
    out.append(("similarity_like_n800", rng.permutation(x)))

    # Unbalanced: k-means splits the big mode, so EM needs a few iterations.
    rng = np.random.default_rng(22)
    n = 400
    k = int(0.9 * n)
    x = np.concatenate([rng.normal(0.3, 0.1, k), rng.normal(0.8, 0.03, n - k)])
    out.append(("unbalanced_n400", x))

    # Loss-like with 40% exact zeros (pairs already separated by the margin):
    # the GMM uses all 10 iterations without converging, and the BMM sees a
    # pile of points at the clip value.
    rng = np.random.default_rng(30)
    n = 1000
    k = int(0.4 * n)
    x = np.concatenate([np.zeros(k), rng.uniform(0.0, 1.0, n - k)])
    out.append(("zero_heavy_loss_n1000", x))

    return [(name, np.asarray(x, dtype=np.float32)) for name, x in out]


def normalise(raw32):
    x = raw32.astype(np.float64)
    lo, hi = x.min(), x.max()
    return (x - lo) / (hi - lo)


def lloyd_from_extremes(x):
    """1-D two-means started at min and max, run until the partition is fixed."""
    c = np.array([x.min(), x.max()])
    labels = None
    for _ in range(1000):
        new = (np.abs(x - c[1]) < np.abs(x - c[0])).astype(int)
        if labels is not None and np.array_equal(new, labels):
            break
        labels = new
        c = np.array([x[labels == 0].mean(), x[labels == 1].mean()])
    return labels


def check_kmeans_agrees(x, name):
    # GaussianMixture(random_state=0) hands its first RandomState(0) draw to
    # KMeans(n_init=1); reproduce that call to see the partition it starts from.
    sk = KMeans(n_clusters=2, n_init=1, random_state=np.random.RandomState(0))
    sk_labels = sk.fit(x[:, None]).labels_
    ours = lloyd_from_extremes(x)
    if not (np.array_equal(sk_labels, ours) or np.array_equal(sk_labels, 1 - ours)):
        raise SystemExit(f"{name}: sklearn k-means and min/max Lloyd disagree")


def gmm_reference(x, name):
    check_kmeans_agrees(x, name)
    with warnings.catch_warnings():
        # Not converging within max_iter is a case we want vectors for.
        warnings.simplefilter("ignore", ConvergenceWarning)
        gm = GaussianMixture(n_init=1, random_state=0, **GMM_SETTINGS)
        gm.fit(x[:, None])
    means = gm.means_[:, 0]
    order = np.argsort(means)  # report components low mean first
    post = gm.predict_proba(x[:, None])
    return {
        "weights": [sig8(v) for v in gm.weights_[order]],
        "means": [sig8(v) for v in means[order]],
        "variances": [sig8(v) for v in gm.covariances_[order, 0, 0]],
        "n_iter": int(gm.n_iter_),
        "converged": bool(gm.converged_),
        "post_low": [sig8(v) for v in post[:, order[0]]],
    }


def beta_logpdf(x, a, b):
    return stats.beta.logpdf(x, a, b)


def bmm_e_step(x, w, a, b):
    logp = np.stack(
        [np.log(w[k]) + beta_logpdf(x, a[k], b[k]) for k in range(2)], axis=1
    )
    norm = special.logsumexp(logp, axis=1)
    return np.exp(logp - norm[:, None]), norm.mean()


def weighted_moments(x, r):
    xbar = np.sum(r * x) / np.sum(r)
    s2 = np.sum(r * (x - xbar) ** 2) / np.sum(r)
    if not (s2 > 1e-12):
        raise SystemExit("dataset hits the BMM variance guard; pick another")
    alpha = xbar * (xbar * (1 - xbar) / s2 - 1)
    beta = alpha * (1 - xbar) / xbar
    if not (alpha > 0 and beta > 0):
        raise SystemExit("dataset hits the BMM alpha/beta guard; pick another")
    return alpha, beta


def bmm_reference(x):
    """Two-component Beta mixture, EM with a method-of-moments M-step."""
    x = np.clip(x, BMM_CLIP, 1 - BMM_CLIP)
    w = np.array([0.5, 0.5])
    a = np.array([1.0, 2.0])
    b = np.array([2.0, 1.0])
    lls = []
    for _ in range(BMM_ITERS):
        r, ll = bmm_e_step(x, w, a, b)
        lls.append(ll)
        for k in range(2):
            a[k], b[k] = weighted_moments(x, r[:, k])
        w = r.mean(axis=0)
    post, _ = bmm_e_step(x, w, a, b)
    means = a / (a + b)
    low = int(np.argmin(means))
    return {
        "weights": [sig8(v) for v in w],
        "alphas": [sig8(v) for v in a],
        "betas": [sig8(v) for v in b],
        "converged": bool(abs(lls[-1] - lls[-2]) < BMM_TOL),
        "post_low": [sig8(v) for v in post[:, low]],
    }


def lgamma_points():
    """scipy's log-gamma from tiny to very large shapes (BMM shapes are
    clamped to concentrations up to 1e6, so arguments reach ~1e6)."""
    small = [1e-3, 0.01, 0.1, 0.5, 1.0, 1.5, 2.0, 2.5, 3.7, 5.0]
    large = [10.0, 33.3, 100.5, 1e4, 1e6, 1.25e7]
    return [[x, float(special.gammaln(x))] for x in small + large]


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    data = {
        "generator": "scripts/reference/mixture_vectors.py",
        "sklearn_version": sklearn.__version__,
        "lgamma": lgamma_points(),
        "datasets": [],
    }
    for name, raw32 in make_datasets():
        x = normalise(raw32)
        data["datasets"].append(
            {
                "name": name,
                # exact float64 value of each float32, so parsing is lossless
                "scores": [float(v) for v in raw32.astype(np.float64)],
                "gmm": gmm_reference(x, name),
                "bmm": bmm_reference(x),
            }
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
