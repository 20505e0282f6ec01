"""Cold start: what the first call of a new shape costs, with and without a warm disk cache (issue 17).

Each measurement runs in a fresh Python process (nothing compiled in memory), against a cache folder
(``GEMMLAB_CACHE_DIR``) that is either empty ("cold") or filled by an earlier process ("disk"):

- ``compile``: the kernels of the calls (forward and backward of nn.Linear shapes), compiled by
  ``gemmlab.warmup(target="h200")`` one at a time (``threads=1``: each kernel's own time) and with one
  thread per CPU. Needs no GPU: this is what a Docker build step pays to fill the cache.
- ``first_call`` (GPU only): the wall time of the first ``gemmlab.linear`` forward and backward of each
  shape (compile, module load, plan, launch, synchronize), then of the second (everything cached), with
  an empty cache, with a warm disk cache, and after ``gemmlab.warmup`` in the same process.

Records (JSON lines, appended to ``--out``): git sha, machine (GPU or CPU), torch, CPUs, the shapes,
and per measurement its seconds.

    PYTHONPATH=src python benchmarks/cold_start.py --out benchmarks/results/cold_start.jsonl
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [(16, 4096, 4096), (2048, 4096, 4096), (2048, 14336, 4096)]  # Llama-7B projections: decode, prefill


def child(mode: str, shapes: list[tuple[int, int, int]], threads: int | None) -> dict:
    """One fresh process's measurement (see the module docstring); returns what it measured."""
    t0 = time.perf_counter()
    import torch

    import gemmlab
    from gemmlab import warm

    out = {"import_s": time.perf_counter() - t0}
    calls = [warm.GemmCall(*s) for s in shapes]
    if mode == "compile":
        r = gemmlab.warmup(calls, backward=True, threads=threads, target="h200")
        out.update(seconds=r.seconds, compile_s=r.compile_seconds, threads=r.threads, kernels=len(r.kernels),
                   status=sorted({k.status for k in r.kernels}),
                   per_kernel={k.kernel.name: round(k.seconds, 4) for k in r.kernels})
        return out
    if mode == "warmup":
        r = gemmlab.warmup(calls, backward=True, threads=threads)
        out.update(warmup_s=r.seconds, warmup_compile_s=r.compile_seconds, kernels=len(r.kernels),
                   unplanned=r.unplanned)
    firsts, seconds = [], []
    for M, N, K in shapes:
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for times in (firsts, seconds):
            torch.cuda.synchronize()
            t = time.perf_counter()
            gemmlab.linear(x, w).backward(torch.ones(M, N, device="cuda", dtype=torch.bfloat16))
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
    out.update(first_s=firsts, second_s=seconds)
    return out


def run_child(mode: str, shapes, cache: str, threads: int | None) -> dict:
    env = dict(os.environ, GEMMLAB_CACHE_DIR=cache, PYTHONPATH=str(ROOT / "src"))
    cmd = [sys.executable, __file__, "--child", mode, "--shapes", json.dumps(shapes)]
    if threads:
        cmd += ["--threads", str(threads)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        raise RuntimeError(f"{mode} child failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results/cold_start.jsonl")
    ap.add_argument("--shapes", default=None, help="JSON list of [M, N, K] (default: Llama-7B projections)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    shapes = [tuple(s) for s in json.loads(args.shapes)] if args.shapes else SHAPES
    if args.child:
        print(json.dumps(child(args.child, shapes, args.threads)))
        return 0

    sys.path.insert(0, str(ROOT / "src"))
    import torch

    from gemmlab.bench import append_records, git_sha

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    base = {"time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "git_sha": git_sha(),
            "machine": gpu or "cpu", "torch": torch.__version__, "cpus": os.cpu_count(), "suite": "cold_start",
            "shapes": shapes}
    recs = []

    def record(kind: str, cache: str, result: dict) -> None:
        recs.append(dict(base, kind=kind, cache=cache, **result))
        brief = {k: v for k, v in result.items() if k != "per_kernel"}
        print(f"{kind:<22} {cache:<6} {json.dumps(brief)}", flush=True)

    with tempfile.TemporaryDirectory() as cold1, tempfile.TemporaryDirectory() as cold2:
        record("compile_sequential", "cold", run_child("compile", shapes, cold1, 1))
        record("compile_sequential", "disk", run_child("compile", shapes, cold1, 1))
        record("compile_threads", "cold", run_child("compile", shapes, cold2, args.threads or os.cpu_count()))
    if gpu:
        with tempfile.TemporaryDirectory() as cold, tempfile.TemporaryDirectory() as warmed:
            record("first_call", "cold", run_child("first_call", shapes, cold, None))
            record("first_call", "disk", run_child("first_call", shapes, cold, None))
            record("warmup_then_call", "cold", run_child("warmup", shapes, warmed, args.threads))
    append_records(args.out, recs)
    print(f"{len(recs)} records appended to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
