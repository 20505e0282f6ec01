"""Probe: source variants of the engine kernel's consumer, each plan built once per variant in one process
and timed against torch.mm (graph replay, interleaved, inputs rotating over 2x the L2). For the 64-row
mid tiles, which session 19 found waiting on "full" (their loads arrive at 53 B/clk an SM where cuBLAS's
same tiling gets 66):

  base     the kernels as they are;
  uniform  the warpgroup index read through __shfl_sync from lane 0, which ptxas then knows to be
           warp-uniform: the consumer's wgmma descriptors are computed in uniform registers (R2UR in the
           64 x 96 tile's loop 34 -> 4, as cuBLAS's loop), so the wgmmas issue sooner after a slot lands;
  early    each k-step's wgmmas waited for at once (wait_group 0) and their slot released right then,
           instead of after the next k-step's wgmmas are issued (wait_group 1): a slot is held ~one k-step
           less where the loads, not the tensor cores, bind (the tensor cores idle between k-steps);
  both     uniform and early.

Variants are patched copies of the kernel sources (probe_mc_parts.patched_root), compiled up front in a
process pool per variant. Plans: the route's engine-kernel plan of the broad set's mid-class shapes with
64-row tiles (every k-th, at most --limit), and a few 128-row controls.

    python benchmarks/probes/probe_variants.py OUT.jsonl [--limit 24] [--variants base,uniform,early,both]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, "benchmarks")
import probe_mc_parts as parts  # noqa: E402
from probe_row_skip import checked_runs  # noqa: E402

import gemmlab  # noqa: E402
from gemmlab import engine  # noqa: E402
from gemmlab.gpu import sample_clocks  # noqa: E402
from gemmlab.jit import compiler  # noqa: E402
from gemmlab.timer import sets_for, time_interleaved  # noqa: E402

UNIFORM = [("engine/gemm.cu", "const int wg = threadIdx.x / 128, t = threadIdx.x % 128;",
            "const int wg = __shfl_sync(0xffffffff, threadIdx.x / 128, 0), t = threadIdx.x % 128;")]
EARLY = [("common/mainloop.cuh",
          "        wgmma_commit();\n        if (kt > k_begin) {\n            wgmma_wait<1>();\n"
          "            if (t == 0) ring.template release<Tr::MCAST>(prev);\n        }\n",
          "        wgmma_commit();\n        wgmma_wait<0>();\n"
          "        if (t == 0) ring.template release<Tr::MCAST>(cur.stage);\n"),
         ("common/mainloop.cuh",
          "    wgmma_wait<0>();\n    if (t == 0) ring.template release<Tr::MCAST>(prev);\n}",
          "    (void)prev;\n}")]
VARIANTS = {"base": [], "uniform": UNIFORM, "early": EARLY, "both": UNIFORM + EARLY}
CONTROLS = [(1536, 1024, 4096), (2048, 1024, 5120), (3000, 1024, 3072)]


def shapes(limit: int) -> list:
    cases = json.load(open(os.path.join(os.path.dirname(__file__), "..", "shapes", "broad.json")))["cases"]
    picked = []
    for c in cases:
        r = gemmlab.plan(c["M"], c["N"], c["K"])
        if c["cls"] == "mid" and r.kernel == "engine" and r.plan is not None and r.plan.bm == 64 \
                and not r.plan.swap_ab:
            picked.append((c["name"], c["M"], c["N"], c["K"]))
    picked = picked[::max(1, len(picked) // limit)][:limit]
    return picked + [(f"control {M}x{N}x{K}", M, N, K) for M, N, K in CONTROLS]


def launches_for(roots: dict, p, a, w, outs):
    """One Engine2Launch of plan p per variant, each compiled from its root. The compiler's first-level
    memo is keyed without the root, so it is cleared at each switch (the memory and disk caches key the
    sources themselves)."""
    plain_root, out = compiler.KERNEL_ROOT, {}
    try:
        for v, root in roots.items():
            compiler.KERNEL_ROOT = root
            compiler._FAST.clear()
            out[v] = engine.Engine2Launch(a, w.t(), outs[v][0], bias=None, c=None, plan=p)
    finally:
        compiler.KERNEL_ROOT = plain_root
        compiler._FAST.clear()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--limit", type=int, default=24)
    ap.add_argument("--variants", default="base,uniform,early,both")
    args = ap.parse_args()
    names = args.variants.split(",")
    roots = {}
    for v in names:
        parts.PATCHES[f"variant-{v}"] = VARIANTS[v]
        roots[v] = parts.patched_root(f"variant-{v}")
    todo = shapes(args.limit)
    for v in names:
        parts.precompile([gemmlab.plan(M, N, K).plan for _, M, N, K in todo], roots[v])
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    gains = {v: [] for v in names}
    with open(args.out, "a") as out:
        for name, M, N, K in todo:
            p = gemmlab.plan(M, N, K).plan
            n = sets_for(2 * (M * K + N * K + M * N), l2)
            xs = [torch.randn(M, K, device="cuda").bfloat16() for _ in range(n)]
            ws = [torch.randn(N, K, device="cuda").bfloat16() for _ in range(n)]
            outs = {v: [torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(n)]
                    for v in names}
            runs, errs = checked_runs(launches_for(roots, p, xs[0], ws[0], outs), xs, ws, outs)
            res = time_interleaved({"torch": lambda i: torch.mm(xs[i], ws[i].t()), **runs}, n)
            t = {k: v.median_ms for k, v in res.timings.items()}
            for v in names:
                gains[v].append(t["base"] / t[v] if "base" in t else 1.0)
            print(f"{name:40s} {M}x{N}x{K} {p.bm}x{p.bn}: torch {t['torch'] * 1e3:7.2f} us; "
                  + " ".join(f"{v} {t['torch'] / t[v]:.3f}" for v in names), flush=True)
            out.write(json.dumps({"suite": "consumer-variants", "name": name, "M": M, "N": N, "K": K,
                                  "plan": repr(p), "ms": t, "ratio": {v: t["torch"] / t[v] for v in names},
                                  "rel_error": errs, "sm_clock_mhz": sample_clocks().sm_mhz,
                                  "baseline": "torch.mm", "git_sha": os.environ.get("GEMMLAB_GIT_SHA")}) + "\n")
    for v in names:
        g = 1.0
        for x in gains[v]:
            g *= x
        print(f"{v}: x{g ** (1 / len(gains[v])):.4f} over base (geomean of {len(gains[v])}), "
              f"min {min(gains[v]):.3f} max {max(gains[v]):.3f}")


if __name__ == "__main__":
    main()
