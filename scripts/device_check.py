#!/usr/bin/env python3
"""The PyTorch side of scripts/device_check.sh, and its report.

  python3 scripts/device_check.py torch --out FILE [--device cuda|cpu] [--quick]
                                  [--mobilenet FILE] [--minilm DIR]
  python3 scripts/device_check.py report DIR
  python3 scripts/device_check.py prepare DEST --mobilenet FILE [--minilm DIR] [--binary BIN]

`torch` times the towers ncclean times, in PyTorch on the same device, at the
same batch size: torchvision's MobileNetV2 with ncclean's weights, a MiniLM
(BERT) built from the same config.json and model.safetensors, and a
ViT-B/32-shaped CLIP (random weights), in f32 and f16. It needs torch (and
torchvision for MobileNetV2) but not the safetensors or transformers
packages. Without torch it writes {"skipped": why} and exits 0.

`prepare` copies what the GPU machine needs into DEST: MobileNetV2's and
MiniLM's weights converted to f16 (which the towers widen back to f32 when
they load them; both sides of every parity check read the same file), MiniLM's
config and tokenizer, and with --binary the CUDA ncclean, all packed as
DEST/pack.tar.xz (device_check.sh unpacks it). Needs numpy. Prints the size against the 64 MiB a device
call may carry.

`report` merges DIR/{system,libraries,ncclean,torch,e2e}.json into
DIR/device_check.json and writes DIR/device_check.md (standard library only).
"""
import argparse
import json
import os
import struct
import sys
import time


def read_safetensors(path, torch):
    """{name: tensor} from a .safetensors file, without the safetensors package."""
    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > 100 * 1024 * 1024:
            raise ValueError(f"{path}: header of {n} bytes is not a safetensors header")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        buf = bytearray(data[lo:hi])
        tensor = torch.frombuffer(buf, dtype=dtypes[t["dtype"]]) if buf else torch.empty(0)
        out[name] = tensor.reshape(t["shape"]).float() if t["dtype"] != "I64" else tensor.reshape(t["shape"])
    return out


def rate(torch, device, items, batches, fn):
    """Items per second of fn() over `batches` timed calls after one warm-up."""
    with torch.inference_mode():
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(batches):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
    return items * batches / (time.perf_counter() - start)


def minilm(torch, config, weights):
    """all-MiniLM-L6-v2 as plain torch modules; mean-pooled, as ncclean pools it."""
    nn = torch.nn
    h, heads, layers = config["hidden_size"], config["num_attention_heads"], config["num_hidden_layers"]

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.word = nn.Embedding(config["vocab_size"], h)
            self.pos = nn.Embedding(config["max_position_embeddings"], h)
            self.typ = nn.Embedding(config["type_vocab_size"], h)
            self.norm = nn.LayerNorm(h, eps=config["layer_norm_eps"])
            self.layers = nn.ModuleList(
                nn.TransformerEncoderLayer(h, heads, config["intermediate_size"], 0.0,
                                           activation="gelu", batch_first=True,
                                           layer_norm_eps=config["layer_norm_eps"])
                for _ in range(layers))

        def forward(self, ids, mask):
            pos = torch.arange(ids.shape[1], device=ids.device)
            x = self.norm(self.word(ids) + self.pos(pos) + self.typ(torch.zeros_like(ids)))
            for layer in self.layers:
                x = layer(x, src_key_padding_mask=~mask)
            m = mask.unsqueeze(-1).to(x.dtype)
            return (x * m).sum(1) / m.sum(1)

    net = Bert()
    w = {k.removeprefix("bert.").removeprefix("embeddings.").removeprefix("encoder."): v
         for k, v in weights.items()}
    sd = {"word.weight": w["word_embeddings.weight"], "pos.weight": w["position_embeddings.weight"],
          "typ.weight": w["token_type_embeddings.weight"], "norm.weight": w["LayerNorm.weight"],
          "norm.bias": w["LayerNorm.bias"]}
    for i in range(layers):
        p = f"layer.{i}."
        q, k, v = (w[p + f"attention.self.{n}.weight"] for n in ("query", "key", "value"))
        qb, kb, vb = (w[p + f"attention.self.{n}.bias"] for n in ("query", "key", "value"))
        o = f"layers.{i}."
        sd.update({
            o + "self_attn.in_proj_weight": torch.cat([q, k, v]),
            o + "self_attn.in_proj_bias": torch.cat([qb, kb, vb]),
            o + "self_attn.out_proj.weight": w[p + "attention.output.dense.weight"],
            o + "self_attn.out_proj.bias": w[p + "attention.output.dense.bias"],
            o + "norm1.weight": w[p + "attention.output.LayerNorm.weight"],
            o + "norm1.bias": w[p + "attention.output.LayerNorm.bias"],
            o + "linear1.weight": w[p + "intermediate.dense.weight"],
            o + "linear1.bias": w[p + "intermediate.dense.bias"],
            o + "linear2.weight": w[p + "output.dense.weight"],
            o + "linear2.bias": w[p + "output.dense.bias"],
            o + "norm2.weight": w[p + "output.LayerNorm.weight"],
            o + "norm2.bias": w[p + "output.LayerNorm.bias"],
        })
    net.load_state_dict(sd)
    return net


def vit(torch, width, layers, heads, image, patch):
    """A ViT-B/32-shaped image tower (CLIP's: pre-norm, class token)."""
    nn = torch.nn

    class Vit(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = nn.Conv2d(3, width, patch, patch, bias=False)
            self.cls = nn.Parameter(torch.randn(1, 1, width))
            self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, width))
            self.pre = nn.LayerNorm(width)
            self.enc = nn.TransformerEncoder(
                nn.TransformerEncoderLayer(width, heads, 4 * width, 0.0, activation="gelu",
                                           batch_first=True, norm_first=True), layers,
                enable_nested_tensor=False)
            self.post = nn.LayerNorm(width)
            self.proj = nn.Linear(width, 512, bias=False)

        def forward(self, x):
            x = self.patch(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1).to(x.dtype), x], 1) + self.pos.to(x.dtype)
            x = self.enc(self.pre(x))
            return self.proj(self.post(x[:, 0]))

    return Vit()


def clip_text(torch, width, layers, heads, vocab, length):
    """A CLIP-B/32-shaped text tower (causal mask, end-token pooling)."""
    nn = torch.nn

    class Text(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, width)
            self.pos = nn.Parameter(torch.randn(1, length, width))
            self.enc = nn.TransformerEncoder(
                nn.TransformerEncoderLayer(width, heads, 4 * width, 0.0, activation="gelu",
                                           batch_first=True, norm_first=True), layers,
                enable_nested_tensor=False)
            self.post = nn.LayerNorm(width)
            self.proj = nn.Linear(width, 512, bias=False)
            self.register_buffer("mask", torch.triu(torch.full((length, length), float("-inf")), 1))

        def forward(self, ids):
            x = self.tok(ids) + self.pos.to(self.tok.weight.dtype)
            x = self.enc(x, mask=self.mask.to(x.dtype), is_causal=True)
            return self.proj(self.post(x[:, -1]))

    return Text()


def torch_side(a):
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means "no torch here"
        why = f"torch is not importable with {sys.executable} ({type(e).__name__}: {e})"
        json.dump({"skipped": why}, open(a.out, "w"))
        print(f"device_check.py: PyTorch comparison skipped: {why}", file=sys.stderr)
        return 0
    dev = a.device
    if dev == "cuda" and not torch.cuda.is_available():
        why = "torch.cuda.is_available() is False"
        json.dump({"skipped": why}, open(a.out, "w"))
        print(f"device_check.py: PyTorch comparison skipped: {why}", file=sys.stderr)
        return 0
    b, n = (4, 1) if a.quick else (256, 3)
    torch.manual_seed(0)
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu",
           "batch": b, "timed_batches": n, "cpu_threads": torch.get_num_threads()}
    dtypes = {"f32": torch.float32, "f16": torch.float16}
    side = 64 if a.quick else 224
    px = torch.randn(b, 3, side, side, device=dev)

    def both(name, build, run):
        out[name] = {}
        for key, dt in dtypes.items():
            try:
                net = build().to(dev, dt).eval()
                out[name][key] = rate(torch, dev, b, n, lambda: run(net, dt))
            except Exception as e:  # noqa: BLE001 - recorded, the other towers still run
                out[name][key] = f"failed: {type(e).__name__}: {e}"

    if a.mobilenet and os.path.isfile(a.mobilenet):
        try:
            import torchvision
            w = read_safetensors(a.mobilenet, torch)

            def mnet():
                m = torchvision.models.mobilenet_v2()
                m.load_state_dict({k: v.long() if k.endswith("num_batches_tracked") else v
                                   for k, v in w.items()}, strict=False)
                return m.features

            both("mobilenet_v2_img_per_s", mnet, lambda m, dt: m(px.to(dt)).mean((2, 3)))
        except ImportError as e:
            out["mobilenet_v2_img_per_s"] = f"skipped: torchvision is not importable ({e})"
    else:
        out["mobilenet_v2_img_per_s"] = f"skipped: {a.mobilenet} not found"

    if a.minilm and os.path.isfile(os.path.join(a.minilm, "config.json")):
        config = json.load(open(os.path.join(a.minilm, "config.json")))
        w = read_safetensors(os.path.join(a.minilm, "model.safetensors"), torch)
        length = 16
        ids = torch.randint(1000, config["vocab_size"], (b, length), device=dev)
        mask = torch.ones(b, length, dtype=torch.bool, device=dev)
        both("minilm_captions_per_s", lambda: minilm(torch, config, w), lambda m, dt: m(ids, mask))
        out["minilm_tokens"] = length
    else:
        out["minilm_captions_per_s"] = f"skipped: no MiniLM at {a.minilm}"

    if a.quick:
        shape = dict(width=64, layers=2, heads=4, image=64, patch=16), dict(width=64, layers=2, heads=4)
    else:
        shape = dict(width=768, layers=12, heads=12, image=224, patch=32), dict(width=512, layers=12, heads=8)
    both("clip_vit_b32_img_per_s", lambda: vit(torch, **shape[0]), lambda m, dt: m(px.to(dt)))
    text_ids = torch.randint(0, 49408, (b, 77), device=dev)
    both("clip_vit_b32_captions_per_s", lambda: clip_text(torch, vocab=49408, length=77, **shape[1]),
         lambda m, dt: m(text_ids))
    json.dump(out, open(a.out, "w"), indent=1)
    return 0


def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError) as e:
        return {"skipped": f"{os.path.basename(path)} unreadable ({e})"}


def fmt(v):
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
    return "—" if v is None else str(v)


def fmt6(v):
    return f"{v:.6f}" if isinstance(v, float) else fmt(v)


def report(a):
    d = a.dir
    merged = {k: load(os.path.join(d, f"{k}.json")) for k in ("system", "libraries", "ncclean", "torch", "e2e")}
    nc, pt = merged["ncclean"], merged["torch"]
    lines = ["| measure | ncclean | PyTorch | ncclean / PyTorch |", "| --- | ---: | ---: | ---: |"]
    ratios = {}
    for key, label in [("mobilenet_v2_img_per_s", "MobileNetV2 img/s"),
                       ("minilm_captions_per_s", "MiniLM captions/s"),
                       ("clip_vit_b32_img_per_s", "CLIP-B/32 image tower img/s"),
                       ("clip_vit_b32_captions_per_s", "CLIP-B/32 text tower captions/s")]:
        for dt in ("f32", "f16"):
            ours = (nc.get("throughput", {}).get(key) or {}).get(dt)
            # Why the PyTorch side did not run is said once, above the table.
            theirs = pt.get(key, {}).get(dt) if isinstance(pt.get(key), dict) else pt.get(key, "skipped")
            ratio = ours / theirs if all(isinstance(x, (int, float)) and x for x in (ours, theirs)) else None
            if ratio is not None:
                ratios[f"{key}.{dt}"] = ratio
            if ours is None and not isinstance(theirs, (int, float)):
                continue
            lines.append(f"| {label}, {dt}, batch {nc.get('throughput', {}).get('batch', '?')} | {fmt(ours)} "
                         f"| {fmt(theirs)} | {fmt(ratio)} |")
    merged["ratios"] = ratios
    for tower, parts in (nc.get("parity") or {}).items():
        if not isinstance(parts, dict):
            continue
        for dt in ("f32", "f16", "bf16"):
            r = parts.get(dt)
            if isinstance(r, dict):
                # MiniLM's entry is one measure; the image towers' are per part.
                for part, m in ({"pooled": r} if "pass" in r else r).items():
                    lines.append(f"| parity {tower} {part} {dt} vs CPU f32: min cosine / max rel Δ | "
                                 f"{fmt6(m.get('min_cosine'))} / {fmt(m.get('max_rel_diff'))} "
                                 f"({'pass' if m.get('pass') else 'FAIL'}) | | |")
    tok = nc.get("throughput", {}).get("minilm_tokenize_captions_per_s")
    if isinstance(tok, (int, float)):
        lines.append(f"| MiniLM tokenising captions/s (CPU, one thread; not in the row above) | {fmt(tok)} | | |")
    dec = nc.get("decode", {})
    for k in ("jpeg_img_per_s", "png_img_per_s"):
        if k in dec:
            lines.append(f"| decode {k.split('_')[0].upper()} img/s ({dec.get('threads')} threads) | {fmt(dec[k])} | | |")
    tr = nc.get("training", {})
    for m in ("vanilla", "gsc"):
        if isinstance(tr.get(m), dict):
            lines.append(f"| {m} s/epoch, {tr.get('pairs')} pairs, dim {tr.get('dim')} | "
                         f"{fmt(tr[m].get('seconds_per_epoch'))} | | |")
    e2e = merged["e2e"]
    if "train_seconds" in e2e:
        lines.append(f"| demo `fit --method vanilla` ({e2e.get('rows')} pairs, 30% noise, {e2e.get('device')}): "
                     f"train s / score pairs/s / AUROC | {fmt(e2e['train_seconds'])} / "
                     f"{fmt(e2e.get('score_pairs_per_second'))} / {fmt(e2e.get('auroc'))} | | |")
    elif e2e.get("skipped"):
        lines.append(f"| demo `fit` | {e2e['skipped']} | | |")
    sysinfo, libs = merged["system"], merged["libraries"]
    head = [f"device: {nc.get('device', '?')}; GPU: {sysinfo.get('gpu', '—')}; "
            f"PyTorch: {pt.get('torch', pt.get('skipped', '?'))}",
            f"CUDA libraries: {(libs.get('libraries') or {}).get('from') or (libs.get('libraries') or {}).get('error', '?')}"]
    if nc.get("stopped") or nc.get("skipped"):
        head.append(f"ncclean gpu-check: {nc.get('stopped') or nc.get('skipped')}")
    head.append("")
    open(os.path.join(d, "device_check.md"), "w").write("\n".join(head + lines) + "\n")
    json.dump(merged, open(os.path.join(d, "device_check.json"), "w"), indent=1)
    return 0


def f16_copy(src, dst, np):
    """Copy a safetensors file with every F32 tensor narrowed to F16 (the
    towers widen them back to f32 when they load them)."""
    with open(src, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    new_header, chunks, at = {}, [], 0
    for name, t in header.items():
        if name == "__metadata__":
            new_header[name] = t
            continue
        lo, hi = t["data_offsets"]
        raw = data[lo:hi]
        if t["dtype"] == "F32":
            raw = np.frombuffer(raw, dtype="<f4").astype("<f2").tobytes()
            t = dict(t, dtype="F16")
        new_header[name] = dict(t, data_offsets=[at, at + len(raw)])
        chunks.append(raw)
        at += len(raw)
    head = json.dumps(new_header).encode()
    head += b" " * (-len(head) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for c in chunks:
            f.write(c)


def prepare(a):
    import shutil
    import numpy as np
    os.makedirs(a.dest, exist_ok=True)
    if a.mobilenet:
        os.makedirs(os.path.join(a.dest, "mobilenet_v2"), exist_ok=True)
        f16_copy(a.mobilenet, os.path.join(a.dest, "mobilenet_v2", "model.safetensors"), np)
    if a.minilm:
        out = os.path.join(a.dest, "minilm")
        os.makedirs(out, exist_ok=True)
        for name in os.listdir(a.minilm):
            if name.endswith((".json", ".txt")) and os.path.isfile(os.path.join(a.minilm, name)):
                shutil.copy(os.path.join(a.minilm, name), out)
        f16_copy(os.path.join(a.minilm, "model.safetensors"), os.path.join(out, "model.safetensors"), np)
    if a.binary:
        shutil.copy(a.binary, os.path.join(a.dest, "ncclean"))
    # One xz archive: the stripped CUDA binary is ~77 MiB, mostly candle's PTX
    # text, and packs to ~11 MiB; the f16 weights shrink ~10%. device_check.sh
    # unpacks DIR/pack.tar.xz into a temporary folder itself.
    import tarfile
    names = sorted(os.listdir(a.dest))
    with tarfile.open(os.path.join(a.dest, "pack.tar.xz"), "w:xz", preset=6) as tar:
        for name in names:
            if name != "pack.tar.xz":
                tar.add(os.path.join(a.dest, name), arcname=name)
    for name in names:
        if name != "pack.tar.xz":
            path = os.path.join(a.dest, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    total = 0
    for root, _, files in os.walk(a.dest):
        for name in files:
            total += os.path.getsize(os.path.join(root, name))
    print(f"{a.dest}: {total / 2**20:.1f} MiB (a device call carries at most 64 MiB with the working tree)")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("torch")
    t.add_argument("--out", required=True)
    t.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    t.add_argument("--quick", action="store_true")
    t.add_argument("--mobilenet")
    t.add_argument("--minilm")
    r = sub.add_parser("report")
    r.add_argument("dir")
    q = sub.add_parser("prepare")
    q.add_argument("dest")
    q.add_argument("--mobilenet")
    q.add_argument("--minilm")
    q.add_argument("--binary", help="the CUDA ncclean to pack with the weights")
    a = p.parse_args()
    return {"torch": torch_side, "report": report, "prepare": prepare}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
