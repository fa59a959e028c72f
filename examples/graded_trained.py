"""Graded agreement on the pairs a model trained on (issue #31).

The graded benchmark (examples/graded_build.rs) scores pairs of images no
method trains on. This script measures the other half: how the labels of a
noisy training file rank its own pairs. The relevance of a row is the mean
cosine (all-MiniLM-L6-v2, mean pooling, as graded_build.rs) between its
caption and the captions of the image it actually shows, other than the
caption itself; the image is found by its bytes in the clean split. Clean
rows score about 0.60, random swaps 0.08, `corrupt --mode hard` rows 0.45.

Usage:
  python examples/graded_trained.py CLEAN.parquet NOISY.parquet LABELS.parquet [LABELS...]

CLEAN: the split before noise (key, image, caption); NOISY: the noisy file
that was fitted (key, image, caption, noisy); LABELS: `ncclean fit`'s or
`score`'s labels of NOISY. Prints, per labels file and column, AUROC of the
`noisy` flag and Kendall tau-b x100 with the relevance. Needs numpy,
pyarrow, scipy, torch and transformers (examples/bench_vs_torch.sh installs
the last two into target/torch-venv) and MiniLM
(scripts/fetch_minilm.sh; env NCCLEAN_MINILM to point elsewhere).
"""

import hashlib
import os
import sys

import numpy as np
import pyarrow.parquet as pq
from scipy.stats import kendalltau

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference"))
from vanilla_numpy import auroc_ap  # noqa: E402  (the project's AUROC, ties averaged)


def embed(captions, model_dir):
    import torch
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    out = {}
    with torch.no_grad():
        for i in range(0, len(captions), 256):
            batch = captions[i : i + 256]
            x = tok(batch, padding=True, truncation=True, return_tensors="pt")
            h = model(**x).last_hidden_state
            m = x["attention_mask"].unsqueeze(-1).float()
            v = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=1)
            out.update(zip(batch, v.numpy()))
    return out


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    clean_path, noisy_path, labels = sys.argv[1], sys.argv[2], sys.argv[3:]
    model_dir = os.environ.get(
        "NCCLEAN_MINILM", os.path.expanduser("~/.cache/ncclean/all-MiniLM-L6-v2")
    )
    clean = pq.read_table(clean_path, columns=["image", "caption"]).to_pydict()
    captions_of = {}
    for image, caption in zip(clean["image"], clean["caption"]):
        captions_of.setdefault(hashlib.md5(image).hexdigest(), []).append(caption)
    noisy = pq.read_table(noisy_path, columns=["key", "image", "caption", "noisy"]).to_pydict()
    emb = embed(sorted(set(clean["caption"]) | set(noisy["caption"])), model_dir)
    truth = {}
    for key, image, caption, flag in zip(noisy["key"], noisy["image"], noisy["caption"], noisy["noisy"]):
        refs = [c for c in captions_of.get(hashlib.md5(image).hexdigest(), []) if c != caption]
        if refs:
            truth[key] = (flag, float(np.mean([emb[c] @ emb[caption] for c in refs])))
    print(f"{len(truth)} of {len(noisy['key'])} rows with reference captions")
    for path in labels:
        t = pq.read_table(path).to_pydict()
        rows = [i for i, k in enumerate(t["key"]) if k in truth]
        flag = np.array([truth[t["key"][i]][0] for i in rows])
        rel = np.array([truth[t["key"][i]][1] for i in rows])
        for col in ["ncclean_clean_prob", "ncclean_similarity"]:
            v = np.array([t[col][i] for i in rows], dtype=float)
            tau = 100 * kendalltau(v, rel).statistic
            print(f"{path}\t{col[8:]}\tAUROC {auroc_ap(-v, flag)[0]:.4f}\ttau_b {tau:.1f}")


if __name__ == "__main__":
    main()
