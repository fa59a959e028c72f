#!/usr/bin/env python3
"""Parity reference for ncclean's `crcl` method, in numpy (issue #16).

CRCL as the authors' released `train_self` (QinYang79/CRCL, model/CRCL.py)
computes it, on ncclean's head and cached features (both from
vanilla_numpy.py, which this file imports):

- per batch: S = head similarity, P1 = row_softmax(S/tau), P2 =
  row_softmax(S^T/tau), p = (diag P1 + diag P2)/2, detached;
- y_last = the stored label; during the first freeze_epochs of a piece
  y = y_last, after them y = beta y_last + (1 - beta) p; then y[y < eps] = 0;
- stored label: p in the last freeze epoch of the first piece, else the
  filtered y (so a pair once filtered restarts its momentum from 0);
- loss = mean_i y_i (-log P1_ii - log P2_ii)
       + lambda mean_i [sum_{j!=i} tan P1_ij / (sum_k tan P1_ik)^(1 - y_i) + the same for P2];
- self-refining pieces: every piece re-initialises the head and Adam
  (global gradient-norm clipping), only the labels carry over.

`--ncclean-labels` switches the label bookkeeping to ncclean's (crcl.rs):
labels stored before the filter, and the first epoch after the first piece's
freeze resets them to p (momentum starts one epoch later than the reference).

Detection score: CRCL has no division; like ncclean, the clean probability is
the high-mean component's posterior of a two-component GMM on p_i, computed
in shuffled batches and averaged over division_shuffles shuffles.

Usage (numpy and pyarrow from PyPI):
    python3 examples/reference/crcl_numpy.py DATA.parquet --cache-dir DIR \\
        [--config examples/configs/flickr8k.toml] [--seed S] [--raw-features]
    python3 examples/reference/crcl_numpy.py --self-test   # loss gradient vs finite differences
"""

import argparse
import json
import os
import sys
import time

if __name__ == "__main__":  # cap BLAS threads before numpy is imported (with vanilla_numpy)
    _pre = argparse.ArgumentParser(add_help=False)
    _pre.add_argument("--threads", type=int, default=0)
    _threads = _pre.parse_known_args()[0].threads
    if _threads > 0:
        for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[_var] = str(_threads)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import vanilla_numpy as ref  # noqa: E402  (after the path)

# Defaults of pipelines/presets/crcl.toml; the config section overrides them.
DEFAULTS = dict(ref.DEFAULTS, lr=5e-4, epochs=None, division_shuffles=3)
PARAMS = dict(tau=0.05, **{"lambda": 5.0}, beta=0.8, epsilon=0.1, freeze_epochs=2, pieces=[5, 5, 5, 30])


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", nargs="?")
    p.add_argument("--cache-dir")
    p.add_argument("--config", default="examples/configs/flickr8k.toml")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--self-test", action="store_true")
    p.add_argument("--markdown-row", action="store_true")
    p.add_argument("--ncclean-labels", action="store_true",
                   help="ncclean's label bookkeeping (unfiltered storage, reset on the first epoch "
                        "after the freeze) instead of train_self's")
    ref.add_variant_args(p)
    return p.parse_args(argv)


def load_config(path):
    import tomllib

    cfg, params = dict(DEFAULTS), dict(PARAMS)
    if path and os.path.exists(path):
        with open(path, "rb") as f:
            sec = tomllib.load(f).get("crcl", {})
        cfg.update({k: v for k, v in sec.items() if k in DEFAULTS})
        params.update(sec.get("params", {}))
    return cfg, params


def softmax_rows(z):
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def acl_loss_grad(s, y, tau, lam):
    """ACL loss (train_self's loss1 + loss2) and dLoss/dS; y is a constant."""
    n = len(s)
    eye = np.eye(n, dtype=bool)
    q = 1.0 - y
    loss, g = 0.0, np.zeros_like(s)
    for transpose in (False, True):
        z = (s.T if transpose else s) / tau
        p = softmax_rows(z)
        t = np.tan(p)
        total = t.sum(1)
        neg = total - np.diag(t)
        pow_ = total ** q
        loss += (-y * np.log(np.diag(p))).mean() + lam * (neg / pow_).mean()
        # d/dP: active term -y_i / P_ii on the diagonal; complementary term through tan.
        dt = lam / n * (np.where(eye, 0.0, 1.0) / pow_[:, None]
                        - (q * neg / (pow_ * total))[:, None])
        dp = dt * (1.0 + t * t)
        dp[eye] += -y / np.diag(p) / n
        dz = p * (dp - (dp * p).sum(1, keepdims=True))
        g += (dz.T if transpose else dz) / tau
    return loss, g


def match_prob(s, tau):
    p1 = softmax_rows(s / tau)
    p2 = softmax_rows(s.T / tau)
    return (np.diag(p1) + np.diag(p2)) / 2


def p_statistic(vi, vt, cfg, tau, rng):
    n, acc = len(vi), np.zeros(len(vi))
    shuffles = max(cfg["division_shuffles"], 1)
    for _ in range(shuffles):
        order = rng.permutation(n)
        for k in range(0, n, cfg["batch_size"]):
            b = order[k:k + cfg["batch_size"]]
            acc[b] += match_prob(vi[b] @ vt[b].T, tau)
    return acc / shuffles


def train(xi, xt, cfg, prm, seed, opts):
    rng = np.random.default_rng(seed)
    n, bs = len(xi), cfg["batch_size"]
    tau, lam, beta, eps, freeze = prm["tau"], prm["lambda"], prm["beta"], prm["epsilon"], prm["freeze_epochs"]
    labels = np.ones(n)
    for piece, length in enumerate(prm["pieces"]):
        head = ref.Head(rng, xi.shape[1], xt.shape[1], cfg)  # self-refining: from scratch
        last = piece + 1 == len(prm["pieces"])
        for t in range(length + freeze):
            decays = sum(1 for e in cfg["lr_decay_epochs"] if t >= e) if last else 0
            lr = cfg["lr"] * cfg["lr_decay"] ** decays
            order = rng.permutation(n)
            total, batches = 0.0, 0
            for k in range(0, n, bs):
                b = order[k:k + bs]
                if len(b) < 2:  # train_self stops at a batch of one
                    break
                loss_p = {}

                def loss_of(s):
                    p = match_prob(s, tau)
                    y_last = labels[b]
                    if opts.ncclean_labels:
                        if t < freeze:
                            y = y_last
                        elif piece == 0 and t == freeze:
                            y = p
                        else:
                            y = beta * y_last + (1 - beta) * p
                        labels[b] = y
                        y = np.where(y < eps, 0.0, y)
                    else:
                        y = y_last if t < freeze else beta * y_last + (1 - beta) * p
                        y = np.where(y < eps, 0.0, y)
                        labels[b] = p if (piece == 0 and t == freeze - 1) else y
                    loss, g = acl_loss_grad(s, y, tau, lam)
                    k_ = len(b) if opts.sum_over_batch else 1.0
                    loss_p["loss"] = loss
                    return loss * k_, g * k_

                loss, grads = head.grads(xi[b], xt[b], loss_of)
                head.step(grads, lr, cfg["grad_clip"])
                total, batches = total + loss_p["loss"], batches + 1
            kept = float((labels >= eps).mean())
            print(f"piece {piece + 1} epoch {t + 1}/{length + freeze}: loss {total / max(batches, 1):.4f}, "
                  f"labels >= eps {kept:.3f}", file=sys.stderr)
    return head, rng


def self_test():
    rng = np.random.default_rng(2)
    worst = 0.0
    s = rng.uniform(-0.5, 0.9, (7, 7))
    y = np.array([1.0, 0.0, 0.5, 0.93, 0.1, 0.0, 0.7])
    loss, g = acl_loss_grad(s, y, 0.05, 5.0)
    for i in range(7):
        for j in range(7):
            up, down = s.copy(), s.copy()
            up[i, j] += 1e-6
            down[i, j] -= 1e-6
            num = (acl_loss_grad(up, y, 0.05, 5.0)[0] - acl_loss_grad(down, y, 0.05, 5.0)[0]) / 2e-6
            worst = max(worst, abs(num - g[i, j]) / max(1.0, abs(num)))
    # Hand-computed value: S = [[1, 0], [0, 1]], tau = 1, lambda = 1, y = (1, 0).
    # P1 = P2 = [[a, b], [b, a]] with a = e/(e+1) = 0.7310586, b = 0.2689414.
    # Active: mean(y_i (-2 ln a)) = (2 * 0.3132617) / 2 = 0.3132617.
    # Complementary: T = tan a + tan b = 0.8968257 + 0.2756188 = 1.1724445;
    # pair 0 (q = 0): 2 tan b = 0.5512376; pair 1 (q = 1): 2 tan b / T = 0.4701611;
    # mean = 0.5106994. Total 0.8239610.
    l2, _ = acl_loss_grad(np.eye(2), np.array([1.0, 0.0]), 1.0, 1.0)
    ok = worst < 1e-5 and abs(l2 - 0.8239610) < 1e-6
    print(json.dumps({"self_test": "ok" if ok else "FAILED", "max_rel_error": worst, "hand_value": l2}))
    return ok


def main(args):
    if args.self_test:
        sys.exit(0 if self_test() else 1)
    if not args.data or not args.cache_dir:
        sys.exit("usage: crcl_numpy.py DATA.parquet --cache-dir DIR (or --self-test)")
    if args.ncr:
        args.sum_over_batch = True
    cfg, prm = load_config(args.config)
    t0 = time.perf_counter()
    xi, xt, noisy = ref.load_features(args.data, args.cache_dir, unit=not args.raw_features)
    t1 = time.perf_counter()
    head, rng = train(xi, xt, cfg, prm, args.seed, args)
    t2 = time.perf_counter()
    vi, vt = head.embed(xi, xt)
    clean = ref.gmm_clean_prob(p_statistic(vi, vt, cfg, prm["tau"], rng), clean_low=False,
                               monotone=args.monotone)
    t3 = time.perf_counter()
    auroc, ap = ref.auroc_ap(-clean, noisy)  # -p, not 1 - p: keeps p < 1e-16 apart
    if args.markdown_row:
        print(f"| {args.label or 'crcl (numpy reference)'} | {noisy.mean():.0%} | {auroc:.4f} | "
              f"{t3 - t0:.1f} | {t2 - t1:.1f} |")
        return
    print(json.dumps({
        "method": "crcl", "implementation": "numpy", "label": args.label, "seed": args.seed,
        "pairs": int(len(xi)), "auroc": round(auroc, 4), "ap": round(ap, 4),
        "read_s": round(t1 - t0, 2), "train_s": round(t2 - t1, 2), "score_s": round(t3 - t2, 2),
    }))


if __name__ == "__main__":
    main(parse_args(sys.argv[1:]))
