#!/usr/bin/env python3
"""Speed peer for ncclean's `vanilla` method in PyTorch (CPU, float32): a port
of examples/reference/vanilla_numpy.py taking the same steps.

The same matching head (per tower: linear + residual MLP, L2-normalised joint
space), the same losses (NCR per-sample hinge for warm-up and division, VSE++
hardest-negative hinge with NCR's per-caption soft margin after it), the same
GMM division and the same schedule. Everything that is not the head comes from
vanilla_numpy.py itself (imported): reading the cached features, the config,
the initial weights and batch orders (the same numpy generator, drawn in the
same order), the mixture and AUROC/AP. What runs in PyTorch is the head's
forward, its backward (autograd), the losses, and Adam (torch.optim.Adam, no
weight decay) after clip_grad_norm_, which is the numpy script's clipping
(scale by clip / (norm + 1e-6) when norm > clip).

It is a speed peer, not a bit-for-bit copy: float32 sums in another order
make the runs drift apart, so results agree with the numpy reference in
distribution (AUROC within noise), not bit for bit. It prints the numpy
script's JSON line (`implementation` = "torch"), so issue #35's "head
training <= PyTorch's time" can be read beside it (examples/bench_train_speed.sh).

Usage (torch, numpy and pyarrow):
    python examples/reference/vanilla_torch.py DATA.parquet --cache-dir DIR \
        [--config examples/configs/flickr8k.toml] [--threads N] [--seed S]
    python examples/reference/vanilla_torch.py --self-test   # losses, gradients, Adam vs numpy
"""

import argparse
import json
import os
import sys
import time


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", nargs="?", help="parquet with image bytes, caption and noisy columns")
    p.add_argument("--cache-dir", help="ncclean feature cache filled by `ncclean fit --cache-dir`")
    p.add_argument("--config", default="examples/configs/flickr8k.toml")
    p.add_argument("--section", default="vanilla", help="config section to read the schedule from")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch (and BLAS) threads")
    p.add_argument("--self-test", action="store_true", help="check against the numpy reference and exit")
    p.add_argument("--label", default="", help="copied into the JSON line")
    return p.parse_args(argv)


ARGS = parse_args(sys.argv[1:])
# Before numpy is first imported (the mixture and the hinge statistic's
# batch orders stay in numpy), so both libraries use the same cores.
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vanilla_numpy as ref  # noqa: E402

torch.set_num_threads(ARGS.threads)


# ---------------------------------------------------------------------------
# The head: ref.init_tower's six arrays per tower (wl, bl, w1, b1, w2, b2),
# drawn from the numpy generator and copied into leaf tensors.

def to_params(arrays, dtype=torch.float32):
    return [torch.tensor(a, dtype=dtype, requires_grad=True) for a in arrays]


def tower(p, x):
    wl, bl, w1, b1, w2, b2 = p
    z = torch.addmm(bl, x, wl.t()) + torch.addmm(b2, torch.relu(torch.addmm(b1, x, w1.t())), w2.t())
    # The numpy script's normalisation (sqrt(|z|^2 + 1e-12)), not F.normalize's max(|z|, eps).
    return z / torch.sqrt((z * z).sum(1, keepdim=True) + 1e-12)


# ---------------------------------------------------------------------------
# Losses on S (S[i, j] = image i against caption j), as ref's.

def per_sample_hinge(s, margin):
    """NCR's per-pair hinge, ref.per_sample_hinge: one value per pair."""
    n = len(s)
    if n < 2:
        return s.new_zeros(n)
    d = s.diagonal()
    off = 1.0 - torch.eye(n, dtype=s.dtype)
    ct = torch.relu(margin - d[:, None] + s) * off
    ci = torch.relu(margin - d[None, :] + s) * off
    return (ct.sum(1) + ci.sum(0)) / (n - 1)


def soft_margin_hinge(s, labels, alpha, m, per_caption=True):
    """ref.soft_margin_hinge_grad's loss; autograd sends the gradient down the
    hardest negatives picked by argmax, as its analytic gradient does."""
    n = len(s)
    d = s.diagonal()
    idx = torch.arange(n)
    margin = alpha * (torch.pow(m, labels) - 1.0) / (m - 1.0)
    masked = s - torch.eye(n, dtype=s.dtype) * 1e4
    if per_caption:
        cost_t = masked + margin[None, :]
        lt = cost_t[idx, cost_t.argmax(1)] - d
    else:
        lt = margin - d + masked[idx, masked.argmax(1)]
    li = margin - d + masked[masked.argmax(0), idx]
    return (torch.relu(lt) + torch.relu(li)).mean()


def clip_and_step(opt, params, clip):
    # clip_grad_norm_ scales by clip / (norm + 1e-6) when that is < 1: ref.Head.step's clipping.
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(params, clip)
    opt.step()


# ---------------------------------------------------------------------------

def hinge_statistic(pi, pt, xi, xt, cfg, rng):
    """ref.hinge_statistic with the embeddings and hinges in torch; the batch orders from rng."""
    with torch.no_grad():
        vi, vt = tower(pi, xi), tower(pt, xt)
        n = len(vi)
        acc = torch.zeros(n, dtype=torch.float64)
        shuffles = max(cfg["division_shuffles"], 1)
        for _ in range(shuffles):
            order = torch.from_numpy(rng.permutation(n))
            for k in range(0, n, cfg["batch_size"]):
                b = order[k:k + cfg["batch_size"]]
                acc[b] += per_sample_hinge(vi[b] @ vt[b].t(), cfg["margin"]).double()
    return (acc / shuffles).float().numpy()


def train(xi, xt, cfg, seed):
    rng = np.random.default_rng(seed)
    # Same draws as ref.train: image tower, then text tower, from the same generator.
    pi = to_params(ref.init_tower(rng, xi.shape[1], cfg["hidden"], cfg["joint_dim"]))
    pt = to_params(ref.init_tower(rng, xt.shape[1], cfg["hidden"], cfg["joint_dim"]))
    params = pi + pt
    opt = torch.optim.Adam(params, lr=cfg["lr"], betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    n, bs = len(xi), cfg["batch_size"]
    for epoch in range(cfg["epochs"]):
        decays = sum(1 for e in cfg["lr_decay_epochs"] if epoch >= e)
        for g in opt.param_groups:
            g["lr"] = cfg["lr"] * cfg["lr_decay"] ** decays
        if epoch < cfg["warmup_epochs"]:
            train_idx = np.arange(n)

            def loss_of(s, b):
                return per_sample_hinge(s, cfg["margin"]).mean()
        else:
            labels = ref.gmm_clean_prob(hinge_statistic(pi, pt, xi, xt, cfg, rng))
            train_idx = np.flatnonzero(ref.split_prob(labels, cfg["threshold"]))
            labels_t = torch.from_numpy(labels.astype(np.float32))

            def loss_of(s, b):
                return soft_margin_hinge(s, labels_t[b], cfg["margin"], cfg["soft_margin_m"])
        order = torch.from_numpy(train_idx[rng.permutation(len(train_idx))])
        total, batches = 0.0, 0
        for k in range(0, len(order), bs):
            b = order[k:k + bs]
            loss = loss_of(tower(pi, xi[b]) @ tower(pt, xt[b]).t(), b)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            clip_and_step(opt, params, cfg["grad_clip"])
            total, batches = total + loss.item(), batches + 1
        print(f"epoch {epoch + 1}/{cfg['epochs']}: loss {total / max(batches, 1):.4f}, "
              f"{len(order)} pairs", file=sys.stderr)
    return pi, pt, rng


# ---------------------------------------------------------------------------

def self_test():
    """Same weights in both: the torch losses and parameter gradients against the numpy
    reference's losses and analytic gradients, then one clipped Adam step against ref.Head.step.
    float32 (what trains); relative errors are max |torch - numpy| / max |numpy| per array."""
    rng = np.random.default_rng(3)
    cfg = dict(ref.DEFAULTS, hidden=24, joint_dim=16)
    head = ref.Head(rng, 20, 12, cfg)
    xi = rng.normal(size=(32, 20)).astype(np.float32)
    xt = rng.normal(size=(32, 12)).astype(np.float32)
    labels = rng.uniform(size=32).astype(np.float32)
    txi, txt_, tlab = torch.from_numpy(xi), torch.from_numpy(xt), torch.from_numpy(labels)
    rel = lambda a, b: float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))  # noqa: E731
    worst_loss = worst_grad = 0.0
    cases = [
        ("per-sample hinge", lambda s: ref.per_sample_hinge_grad(s, 0.2),
         lambda s: per_sample_hinge(s, 0.2).mean()),
        ("soft-margin hinge, per-caption margin",
         lambda s: ref.soft_margin_hinge_grad(s, labels, 0.2, 10.0, per_caption=True),
         lambda s: soft_margin_hinge(s, tlab, 0.2, 10.0, per_caption=True)),
        ("soft-margin hinge, own margin",
         lambda s: ref.soft_margin_hinge_grad(s, labels, 0.2, 10.0),
         lambda s: soft_margin_hinge(s, tlab, 0.2, 10.0, per_caption=False)),
    ]
    for name, np_loss, t_loss in cases:
        loss_np, grads_np = head.grads(xi, xt, np_loss)
        pi, pt = to_params(head.pi), to_params(head.pt)
        loss_t = t_loss(tower(pi, txi) @ tower(pt, txt_).t())
        loss_t.backward()
        el = abs(loss_t.item() - float(loss_np)) / max(abs(float(loss_np)), 1e-12)
        eg = max(rel(p.grad.numpy(), g) for p, g in zip(pi + pt, grads_np))
        worst_loss, worst_grad = max(worst_loss, el), max(worst_grad, eg)
        print(f"{name}: loss {loss_t.item():.6f} vs {float(loss_np):.6f} (rel {el:.1e}), "
              f"gradients rel {eg:.1e}", file=sys.stderr)
    # One clipped Adam step from the gradients numpy found (a small clip, so that it bites).
    _, grads_np = head.grads(xi, xt, cases[1][1])
    params = to_params(head.params)
    opt = torch.optim.Adam(params, lr=1e-2)
    for p, g in zip(params, grads_np):
        p.grad = torch.from_numpy(g.copy())
    clip_and_step(opt, params, 0.05)
    head.step(grads_np, 1e-2, 0.05)
    worst_step = max(rel(p.detach().numpy(), q) for p, q in zip(params, head.params))
    print(f"clipped Adam step: parameters rel {worst_step:.1e}", file=sys.stderr)
    ok = worst_loss < 1e-5 and worst_grad < 1e-4 and worst_step < 1e-5
    print(json.dumps({"self_test": "ok" if ok else "FAILED", "max_rel_loss": worst_loss,
                      "max_rel_grad": worst_grad, "max_rel_adam_step": worst_step}))
    return ok


def main():
    if ARGS.self_test:
        sys.exit(0 if self_test() else 1)
    if not ARGS.data or not ARGS.cache_dir:
        sys.exit("usage: vanilla_torch.py DATA.parquet --cache-dir DIR (or --self-test)")
    cfg = ref.load_config(ARGS.config, ARGS.section)
    t0 = time.perf_counter()
    xi, xt, noisy = ref.load_features(ARGS.data, ARGS.cache_dir)
    xi, xt = torch.from_numpy(xi), torch.from_numpy(xt)
    t1 = time.perf_counter()
    pi, pt, rng = train(xi, xt, cfg, ARGS.seed)
    t2 = time.perf_counter()
    clean = ref.gmm_clean_prob(hinge_statistic(pi, pt, xi, xt, cfg, rng))
    t3 = time.perf_counter()
    auroc, ap = ref.auroc_ap(-clean, noisy)  # -p, not 1 - p: as the numpy script
    print(json.dumps({
        "method": "vanilla", "implementation": "torch", "label": ARGS.label, "seed": ARGS.seed, "pairs": int(len(xi)),
        "auroc": round(auroc, 4), "ap": round(ap, 4),
        "read_s": round(t1 - t0, 2), "train_s": round(t2 - t1, 2), "score_s": round(t3 - t2, 2),
        "fit_s": round(t3 - t1, 2), "threads": ARGS.threads, "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
