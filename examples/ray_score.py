#!/usr/bin/env python3
"""Score many shards with ncclean on Ray: one task per shard (or group).

    python3 examples/ray_score.py shards/ --out OUT --fit-shards 16        # laptop
    python3 examples/ray_score.py shards/ --out OUT --fit-sample 200000    # large input
    python3 examples/ray_score.py shards/ --out OUT --checkpoint RUN \\
        --address auto --task-cpus 4 --task-gpus 1                         # cluster

What it does:

1. Lists the shards (files, directories of *.parquet / *.tar, globs), sorted.
2. Fits once, unless --checkpoint is given or OUT/run is a complete run:
   `ncclean fit` on --fit-shards shards picked with --seed (all shards if
   not given), as one Ray task, into OUT/run. With --fit-sample N the fit
   trains on N rows drawn at random across those shards (`ncclean fit
   --sample N --seed SEED`: one streaming read of every shard, only the drawn
   rows kept); the score step then labels every row.
3. Runs one Ray task per --group shards: `ncclean score SHARDS --checkpoint
   RUN --out-dir OUT/labels` with the task's num_cpus / num_gpus. ncclean
   writes OUT/labels/<stem>.parquet and a completion marker per shard and
   skips shards whose marker matches the checkpoint and the shard's content,
   so a relaunch (or a Ray retry after a lost worker) redoes only what is
   missing. Exit 1 (a runtime failure) and lost workers are retried up to
   --max-retries times; bad input or usage (exit 2, 3) is not.
4. Writes OUT/summary.json: shards, rows, usable pairs, skipped rows, clean
   pairs, the estimated noise rate over all shards, shards skipped as already
   complete, and per-shard rows and seconds (from the markers).

OUT must be on storage every Ray node sees (a shared file system) when the
cluster has more than one node; the ncclean binary must exist at the same
path on every node (--ncclean). Needs only `ray` (python3 -m pip install ray).
"""

import argparse
import glob
import json
import os
import random
import shlex
import subprocess
import sys
import time

SHARD_SUFFIXES = (".parquet", ".tar")


class Retryable(RuntimeError):
    """ncclean failed in a way another attempt may fix (I/O, lost worker)."""


class Permanent(RuntimeError):
    """Usage or input error: retrying cannot help."""


def list_shards(inputs):
    """Files, directories of shards and globs, expanded and sorted by path
    (ncclean sorts the same way, so --num-shards splits agree)."""
    out = []
    for item in inputs:
        if any(c in item for c in "*?["):
            matches = glob.glob(item)
            if not matches:
                sys.exit(f"error: {item}: no files match")
            out.extend(matches)
        elif os.path.isdir(item):
            found = [
                os.path.join(item, n)
                for n in os.listdir(item)
                if not n.startswith(".") and n.lower().endswith(SHARD_SUFFIXES)
            ]
            if not found:
                sys.exit(f"error: {item}: directory has no *.parquet or *.tar shards")
            out.extend(found)
        elif os.path.isfile(item):
            out.append(item)
        else:
            sys.exit(f"error: {item}: no such file or directory")
    return sorted(set(os.path.abspath(p) for p in out))


def stem_of(path):
    """The stem ncclean names a shard's outputs after (src/run/shards.rs)."""
    name = os.path.basename(path)
    once = name[: name.rfind(".")] if name.rfind(".") > 0 else name
    if once.lower().endswith(".tar"):
        once = once[: once.rfind(".")]
    return once


def read_marker(labels_dir, stem):
    try:
        with open(os.path.join(labels_dir, f"{stem}.done.json"), "rb") as f:
            return json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return None


def run_ncclean(args, cpus):
    """Run the ncclean binary; raise Retryable / Permanent on failure."""
    env = dict(os.environ)
    # Matrix products use this many threads: the task's share of the node.
    env.setdefault("RAYON_NUM_THREADS", str(max(1, int(cpus))))
    started = time.time()
    p = subprocess.run(args, capture_output=True, text=True, env=env)
    if p.returncode in (0, 4):  # 4: written in full, but many rows were unusable
        return {"summary": json.loads(p.stdout or "{}"), "seconds": time.time() - started,
                "exit_code": p.returncode, "stderr_tail": p.stderr[-2000:]}
    what = f"{shlex.join(args)} exited {p.returncode}:\n{p.stderr[-4000:]}"
    if p.returncode in (2, 3):
        raise Permanent(what)
    raise Retryable(what)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="shard files, directories of them, or globs")
    ap.add_argument("--out", required=True, help="output directory: run/, labels/, summary.json")
    ap.add_argument("--ncclean", default="ncclean", help="path of the ncclean binary (on every node)")
    ap.add_argument("--checkpoint", help="an existing run directory; skips the fit")
    ap.add_argument("--fit-shards", type=int, help="fit on this many shards picked with --seed (default: all)")
    ap.add_argument("--fit-sample", type=int,
                    help="fit on this many rows drawn across the fit shards (ncclean fit --sample N "
                         "--seed SEED; default: every row)")
    ap.add_argument("--fit-args", default="", help="extra arguments for ncclean fit, e.g. '--method esc'")
    ap.add_argument("--score-args", default="", help="extra arguments for ncclean score, e.g. '--cache-dir DIR'")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fit-shard pick and of --fit-sample's draw")
    ap.add_argument("--group", type=int, default=1, help="shards per Ray task")
    ap.add_argument("--task-cpus", type=float, default=1, help="num_cpus of every task")
    ap.add_argument("--task-gpus", type=float, default=0, help="num_gpus of every task")
    ap.add_argument("--max-retries", type=int, default=3, help="retries of a failed or lost task")
    ap.add_argument("--address", help="Ray cluster address (e.g. auto); default: a local Ray")
    ap.add_argument("--num-cpus", type=int, help="CPUs of the local Ray (without --address)")
    a = ap.parse_args()

    import ray  # imported here so --help works without ray

    shards = list_shards(a.inputs)
    if not shards:
        sys.exit("error: no shards")
    out = os.path.abspath(a.out)
    labels_dir = os.path.join(out, "labels")
    os.makedirs(labels_dir, exist_ok=True)
    if a.address:
        ray.init(address=a.address)
    else:
        ray.init(num_cpus=a.num_cpus)
    started = time.time()
    resources = {"num_cpus": a.task_cpus, "num_gpus": a.task_gpus}
    task = ray.remote(run_ncclean).options(
        max_retries=a.max_retries, retry_exceptions=[Retryable], **resources
    )

    run = a.checkpoint
    fit_shards = None
    if run is None:
        run = os.path.join(out, "run")
        complete = False
        try:
            with open(os.path.join(run, "run.json")) as f:
                complete = bool(json.load(f).get("complete"))
        except (OSError, ValueError):
            pass
        if not complete:
            fit_shards = shards
            if a.fit_shards is not None and a.fit_shards < len(shards):
                fit_shards = sorted(random.Random(a.seed).sample(shards, a.fit_shards))
            args = [a.ncclean, "fit", *fit_shards, "--out-dir", run]
            if a.fit_sample is not None:
                args += ["--sample", str(a.fit_sample), "--seed", str(a.seed)]
            args += shlex.split(a.fit_args)
            sample = f" (a sample of {a.fit_sample} rows)" if a.fit_sample is not None else ""
            print(f"fitting on {len(fit_shards)} of {len(shards)} shards{sample} into {run}",
                  file=sys.stderr)
            ray.get(task.remote(args, a.task_cpus))

    before = {stem_of(s): read_marker(labels_dir, stem_of(s)) for s in shards}
    groups = [shards[i : i + a.group] for i in range(0, len(shards), max(1, a.group))]
    pending = [
        task.remote([a.ncclean, "score", *g, "--checkpoint", run, "--out-dir", labels_dir,
                     *shlex.split(a.score_args)], a.task_cpus)
        for g in groups
    ]
    failures = []
    partial = 0
    for g, ref in zip(groups, pending):
        try:
            r = ray.get(ref)
            partial += r["exit_code"] == 4
        except Exception as e:  # a task that failed after its retries
            failures.append({"shards": g, "error": str(e)[-4000:]})

    per_shard, totals, skipped_shards = [], dict(rows=0, usable=0, skipped=0, clean=0, noisy=0), 0
    for s in shards:
        stem = stem_of(s)
        m = read_marker(labels_dir, stem)
        if m is None:
            per_shard.append({"shard": s, "stem": stem, "complete": False})
            continue
        skipped = before[stem] == m
        skipped_shards += skipped
        c = m["counts"]
        for k, v in (("rows", "rows"), ("usable", "usable"), ("skipped", "skipped"),
                     ("clean", "kept"), ("noisy", "noisy")):
            totals[k] += c[v]
        per_shard.append({"shard": s, "stem": stem, "complete": True, "skipped": skipped,
                          "rows": c["rows"], "usable": c["usable"], "clean": c["kept"],
                          "seconds": m["seconds"]})
    summary = {
        "shards": len(shards),
        "complete": sum(p["complete"] for p in per_shard),
        "skipped_shards": skipped_shards,
        "failed_tasks": failures,
        "partial_tasks": partial,
        "rows": totals["rows"],
        "usable": totals["usable"],
        "skipped_rows": totals["skipped"],
        "clean": totals["clean"],
        "estimated_noise_rate": totals["noisy"] / max(1, totals["usable"]),
        "checkpoint": run,
        "fit_shards": fit_shards,
        "fit_sample": a.fit_sample,
        "labels_dir": labels_dir,
        "wall_seconds": time.time() - started,
        "per_shard": per_shard,
    }
    tmp = os.path.join(out, f".summary.json.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=1)
    os.replace(tmp, os.path.join(out, "summary.json"))
    print(json.dumps({k: v for k, v in summary.items() if k != "per_shard"}))
    ray.shutdown()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
