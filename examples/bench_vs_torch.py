"""PyTorch side of examples/bench_vs_torch.sh: transformers' MiniLM with
mean pooling on the same captions, the same weights directory, the same
batches (windows of 512 sorted by byte length, batches of 64) and 2 threads.

Usage: bench_vs_torch.py MINILM_DIR CAPTIONS.txt REPS
Prints one line per repetition: "torch <captions/s>".
"""
import sys
import time

import torch
from transformers import AutoModel, AutoTokenizer

model_dir, caps_path, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.set_num_threads(2)
captions = [l for l in open(caps_path, encoding="utf-8").read().split("\n") if l]
batches = []
for w in range(0, len(captions), 512):
    window = sorted(captions[w : w + 512], key=lambda c: len(c.encode()))
    batches += [window[i : i + 64] for i in range(0, len(window), 64)]
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModel.from_pretrained(model_dir).eval()


def encode(batch):
    enc = tok(batch, padding=True, truncation=True, max_length=128, return_tensors="pt")
    out = model(**enc).last_hidden_state
    m = enc["attention_mask"].unsqueeze(-1).to(out.dtype)
    return (out * m).sum(1) / m.sum(1).clamp(min=1e-9)


with torch.inference_mode():
    encode(batches[0])  # warm-up
    for _ in range(reps):
        t = time.perf_counter()
        for b in batches:
            encode(b)
        print(f"torch {len(captions) / (time.perf_counter() - t):.1f}", flush=True)
