"""Probe: source variants of the engine kernels' consumer, each plan built once per variant in one process
and timed against the baseline (graph replay, interleaved, inputs rotating over 2x the L2). Written for the
64-row mid tiles, which session 19 found waiting on "full" (their loads arrive at 53 B/clk an SM where
cuBLAS's same tiling gets 66):

  base       the kernels as they are (since session 20 the warpgroup index comes from warpgroup_index(),
             lane 0's value through __shfl_sync, so the consumers' wgmma descriptors stay in uniform
             registers, GemmTraits::UNIFORM_WG: plain epilogues, schedules not streamed);
  divergent  the warpgroup index from threadIdx.x directly everywhere, the form before session 20 (ptxas
             cannot tell the branch on it is warp-uniform: R2UR in the 64 x 96 tile's kernel 5 -> 34);
  early      each k-step's wgmmas waited for at once (wait_group 0) and their slot released right then,
             instead of after the next k-step's wgmmas are issued (wait_group 1). Measured in session 20:
             x0.90 (the tensor cores idle between k-steps);
  converge   the streamed schedules with the uniform index as well, and a __syncwarp after their divergent
             partial stores, so their k-loops are proved uniform too (not measured yet);
  hint1..3   the operand loads with L2 eviction priorities (common/tma.cuh L2_HINT; below); store: the
             output's TMA stores evict-first (L2_STORE_HINT); hint1store: both.

Variants are patched copies of the kernel sources (probe_mc_parts.patched_root), compiled up front in a
process pool per variant. Shapes (--pick): mid64, the route's engine-kernel plan of the broad set's
mid-class shapes with 64-row tiles (every k-th, at most --limit) and three 128-row controls; broad, every
k-th broad-set shape whose route is the engine kernel, any tile; streamed, the broad-set shapes whose route
is stream-K or global split-K; small, every k-th shape whose route is the engine kernel (swapped plans too)
priced under 25 us; splitk, every k-th shape whose route is cluster split-K (swapped too); stream, every
k-th shape of M <= 128 whose route is the engine kernel (the weight streams, any plan); decode, every k-th
shape the decode kernel can run, on the decode kernel (its default variant);
moe, grouped_bench's MoE shapes on the grouped kernel against
torch._grouped_mm.

    python benchmarks/probes/probe_variants.py OUT.jsonl [--pick mid64|broad|streamed|moe] [--limit 24]
        [--variants base,divergent]   (--pick small --variants base,warm,warm32,order)
        (--pick stream --variants base,hint1,hint2,hint3; --pick moe the same; --pick decode
         --variants base,dhint; --pick decode --variants base,tail1,nopf,old --shapes "1,1000,999;1,4096,4544")
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

WG = "Tr::UNIFORM_WG ? warpgroup_index() : static_cast<int>(threadIdx.x / 128)"
DIVERGENT = [(f, WG, "static_cast<int>(threadIdx.x / 128)")
             for f in ("engine/gemm.cu", "engine/gemm_grouped.cu", "engine/gemm_fp8.cu")]
EARLY = [("common/mainloop.cuh",
          "        wgmma_commit();\n        if (kt > k_begin) {\n            wgmma_wait<1>();\n"
          "            if (t == 0) ring.template release<Tr::MCAST>(prev);\n        }\n",
          "        wgmma_commit();\n        wgmma_wait<0>();\n"
          "        if (t == 0) ring.template release<Tr::MCAST>(cur.stage);\n"),
         ("common/mainloop.cuh",
          "    wgmma_wait<0>();\n    if (t == 0) ring.template release<Tr::MCAST>(prev);\n}",
          "    (void)prev;\n}")]
# converge: the streamed schedules (stream-K, global split-K) with the uniform index too, and a __syncwarp
# after their divergent partial stores (one thread's flag release; the rank-sum's per-thread trip count),
# after which ptxas proves the k-loop warp-uniform again: R2UR in their k-loops 16-32 -> 0 (CPU, session 20),
# but 128 x 256 stream-K and 64 x 256 fp32 stream-K then spill (a few bytes).
SK_RELEASE = "    if (t == 0) flag_release_add(&flags[2 * slot + consumer], 1);\n}"
GSK_END = "            store_pair<Tr>(ep, r + 8, c, sum.z, sum.w);\n        }\n    }\n}"
CONVERGE = [("common/gemm_traits.cuh", "SCHEDULE != STREAM_K && SCHEDULE != SPLIT_K_GLOBAL && !kBias",
             "!kBias"),
            ("common/reduction.cuh", SK_RELEASE, SK_RELEASE[:-1] + "    __syncwarp();\n}"),
            ("common/reduction.cuh", GSK_END, GSK_END[:-1] + "    __syncwarp();\n}")]
# warm / warm2 / warm32: before pdl_wait a CTA asks the L2 for its first unit's first k-steps of the weight
# (EARLY_L2 1, its producer thread; warm32: thread 32, an idle warp of the producer warpgroup) or of both
# operands (2) (mainloop.cuh prewarm_l2; off in the library: measured slower, session 22).
# pull: the split-K reduction through remote (DSMEM) loads after a cluster barrier, the form before
# session 22 (SPLIT_PUSH off).
PULL = [("common/gemm_traits.cuh", "#define SPLIT_PUSH_ON 1", "#define SPLIT_PUSH_ON 0")]
# fullA: the grouped kernel's A boxes all BM rows (no short boxes over a group's last rows), the form before
# session 23.
FULL_A = [("engine/gemm_grouped.cu", "#define GROUPED_SHORT_A 1", "#define GROUPED_SHORT_A 0")]
WARM, WARM2 = ([("common/mainloop.cuh", "#define EARLY_L2 0", f"#define EARLY_L2 {v}")] for v in (1, 2))
WARM32 = WARM + [("engine/gemm.cu", "        if (threadIdx.x == 0) {\n            TileScheduler<Tr::SCHEDULE> first(",
                  "        if (threadIdx.x == 32) {\n            TileScheduler<Tr::SCHEDULE> first(")]
# order: the producer thread reads its first unit's entry of the order table before pdl_wait (the table is
# written once by the host when the plan is built, never by a kernel), so that read's latency (a miss to HBM
# after the previous launch streamed its operands through the L2) overlaps the kernel before instead of
# delaying the first loads.
ORDER_FIRST = [
    ("engine/gemm.cu", "    pdl_wait();\n    pdl_trigger_early();\n",
     "    int first_packed = 0;\n    if (threadIdx.x == 0) {\n"
     "        TileScheduler<Tr::SCHEDULE> first0(num_tiles, k_iters, ScheduleArgs{splits, sk_tiles, sk_ctas});\n"
     "        WorkUnit f0;\n        if (first0.next(f0)) first_packed = __ldg(order + f0.tile);\n    }\n"
     "    pdl_wait();\n    pdl_trigger_early();\n"),
    ("engine/gemm.cu", "            RingCursor cur;\n            while (sched.next(u)) {\n"
     "                const int packed = order[u.tile];\n",
     "            RingCursor cur;\n            int uses = 0;\n            while (sched.next(u)) {\n"
     "                const int packed = uses++ == 0 ? first_packed : order[u.tile];\n")]
# hint1 / hint2 / hint3: the operand loads with L2 eviction priorities (common/tma.cuh, L2_HINT): the
# weight's evict-first and the activations' evict-last; the weight's evict-first only; both evict-last.
HINT1, HINT2, HINT3 = ([("common/tma.cuh", "#define L2_HINT 0", f"#define L2_HINT {v}")] for v in (1, 2, 3))
# store: the TMA stores of the output ask for evict-first (common/tma.cuh, L2_STORE_HINT); hint1store: and
# hint1's loads.
STORE_HINT = [("common/tma.cuh", "#define L2_STORE_HINT 0", "#define L2_STORE_HINT 1")]
# dhint: the decode kernel's weight loads fetch 256 bytes into the L2 (engine/decode.cu, DECODE_LOAD_HINT;
# --pick decode).
DHINT = [("engine/decode.cu", "#define DECODE_LOAD_HINT 0", "#define DECODE_LOAD_HINT 1")]
# tail1: the decode kernel's K tail one 32-k chunk at a time, each chunk's loads then its mmas (the form before
# session 48; engine/decode.cu DECODE_TAIL_AHEAD); base issues two or four chunks' loads together
# (decode::tail_ahead). Only K % 128 != 0 has a tail: --pick decode --shapes "1,1000,999;...".
TAIL1 = [("engine/decode.cu", "#define DECODE_TAIL_AHEAD 0", "#define DECODE_TAIL_AHEAD 1")]
# nopf: the L2 prefetch stops before the K tail's chunk (DECODE_PREFETCH_TAIL 0, the form before session 48);
# old: nopf and tail1, the kernel before session 48.
NOPF = [("engine/decode.cu", "#define DECODE_PREFETCH_TAIL 1", "#define DECODE_PREFETCH_TAIL 0")]
VARIANTS = {"base": [], "divergent": DIVERGENT, "order": ORDER_FIRST, "early": EARLY, "converge": CONVERGE,
            "warm": WARM, "warm2": WARM2, "warm32": WARM32, "pull": PULL, "fullA": FULL_A, "hint1": HINT1, "hint2": HINT2,
            "hint3": HINT3, "store": STORE_HINT, "hint1store": HINT1 + STORE_HINT, "dhint": DHINT,
            "tail1": TAIL1, "nopf": NOPF, "old": TAIL1 + NOPF}
CONTROLS = [(1536, 1024, 4096), (2048, 1024, 5120), (3000, 1024, 3072)]
# --pick moe: probe_row_skip's four MoE shapes and small-T ones where groups hold a few rows (DBRX, Mixtral
# decode-sized batches, DeepSeek-V2-Lite's 64 experts).
MOE_SHAPES = [("mixtral", "gate_up", 8, 28672, 4096, 4096), ("mixtral", "down", 8, 4096, 14336, 4096),
              ("mixtral22b", "gate_up", 8, 32768, 6144, 512), ("qwen_moe", "gate_up", 60, 2816, 2048, 16384),
              ("dbrx", "gate_up", 16, 21504, 6144, 512), ("mixtral", "gate_up", 8, 28672, 4096, 256),
              ("dsv2lite", "gate_up", 64, 2816, 2048, 256), ("mixtral22b", "down", 8, 6144, 16384, 512)]


def shapes(pick: str, limit: int) -> list:
    """(name, M, N, K) of the broad set's shapes for --pick mid64 (with the 128-row controls), broad or
    streamed."""
    cases = json.load(open(os.path.join(os.path.dirname(__file__), "..", "shapes", "broad.json")))["cases"]
    picked = []
    for c in cases:
        r = gemmlab.plan(c["M"], c["N"], c["K"])
        if r.kernel != "engine" or r.plan is None or c["cls"] == "unaligned":
            continue
        if pick == "splitk" and r.plan.schedule == "split_k":
            picked.append((c["name"], c["M"], c["N"], c["K"]))
            continue
        if pick == "stream" and c["M"] <= 128:  # the weight streams: few tokens, any plan (swapped too)
            picked.append((c["name"], c["M"], c["N"], c["K"]))
            continue
        if pick == "small" and r.plan.predicted_s < 25e-6:
            picked.append((c["name"], c["M"], c["N"], c["K"]))
            continue
        if r.plan.swap_ab:
            continue
        if pick == "broad" or (pick == "mid64" and c["cls"] == "mid" and r.plan.bm == 64) or (
                pick == "streamed" and r.plan.schedule in ("stream_k", "split_k_global")):
            picked.append((c["name"], c["M"], c["N"], c["K"]))
    picked = picked[::max(1, len(picked) // limit)][:limit]
    if pick != "mid64":
        return picked
    return picked + [(f"control {M}x{N}x{K}", M, N, K) for M, N, K in CONTROLS]


class UseRoot:
    """Compile from kernel source root ``root`` while active. The compiler's first-level memo is keyed
    without the root, so it is cleared at each switch (the memory and disk caches key the sources)."""

    def __init__(self, root):
        self.root = root

    def __enter__(self):
        self.plain = compiler.KERNEL_ROOT
        compiler.KERNEL_ROOT = self.root
        compiler._FAST.clear()

    def __exit__(self, *exc):
        compiler.KERNEL_ROOT = self.plain
        compiler._FAST.clear()


def moe(roots: dict, out, l2, gains: dict) -> None:
    """The grouped kernel per variant on probe_row_skip's MoE shapes (uneven routing), against
    torch._grouped_mm; checked against an fp32 reference first."""
    from probe_row_skip import moe_cases

    from gemmlab import grouped
    for model, proj, G, N, K, T, offs, sizes, p, n, xs, ws, outs, ref in moe_cases(l2, roots, MOE_SHAPES):
        errs = {}
        for v, root in roots.items():
            with UseRoot(root):
                grouped.launch(p, xs[0], ws[0], offs, 1, outs[v][0])
            torch.cuda.synchronize()
            errs[v] = ((outs[v][0].float() - ref).norm() / ref.norm()).item()
            assert errs[v] < 2e-2, (v, errs[v])

        def run(v):
            def f(i):
                with UseRoot(roots[v]):
                    grouped.launch(p, xs[i], ws[i], offs, 1, outs[v][i])
            return f

        def base(i):
            torch._grouped_mm(xs[i], ws[i].transpose(1, 2), offs=offs[1:])

        res = time_interleaved({"torch": base, **{v: run(v) for v in roots}}, n)
        report(out, f"{model} {proj} T={T}", f"G={G} {N}x{K}", p, res, errs, gains,
               {"model": model, "proj": proj, "G": G, "N": N, "K": K, "T": T, "baseline": "torch._grouped_mm"})


def report(out, name: str, shape: str, p, res, errs, gains: dict, extra: dict) -> None:
    t = {k: v.median_ms for k, v in res.timings.items()}
    for v in gains:
        gains[v].append(t["base"] / t[v] if "base" in t else 1.0)
    print(f"{name:40s} {shape}: torch {t['torch'] * 1e3:7.2f} us; "
          + " ".join(f"{v} {t['torch'] / t[v]:.3f}" for v in gains), flush=True)
    out.write(json.dumps({"suite": "consumer-variants", "name": name, **extra, "plan": repr(p), "ms": t,
                          "ratio": {v: t["torch"] / t[v] for v in gains}, "rel_error": errs,
                          "sm_clock_mhz": sample_clocks().sm_mhz,
                          "git_sha": os.environ.get("GEMMLAB_GIT_SHA")}) + "\n")
    out.flush()


def decode_shapes(limit: int) -> list:
    """(name, M, N, K) of every k-th broad-set shape (at most ``limit``) the decode kernel can run."""
    from gemmlab import decode
    cases = json.load(open(os.path.join(os.path.dirname(__file__), "..", "shapes", "broad.json")))["cases"]
    picked = []
    for c in cases:
        M, N, K = c["M"], c["N"], c["K"]
        if c["cls"] == "unaligned" or M > decode.MAX_M or K % 8 or N % 8:
            continue
        meta = dict(device="meta", dtype=torch.bfloat16)
        if engine.use_decode(torch.empty(M, K, **meta), torch.empty(N, K, **meta).t(), torch.empty(M, N, **meta)):
            picked.append((c["name"], M, N, K))
    return picked[::max(1, len(picked) // limit)][:limit]


def decode_launches(roots: dict, a, w, outs):
    """One decode launch (its default variant) of a @ w.t() per variant, each compiled from its root."""
    from gemmlab import decode
    from gemmlab.epilogue import ctypes, epi_bits
    sm = torch.cuda.get_device_properties(a.device).multi_processor_count
    out = {}
    for v, root in roots.items():
        with UseRoot(root):
            out[v] = decode.prepare(a, w.t(), outs[v][0], epi=epi_bits(False, False, None),
                                    ctypes=ctypes(a.dtype, a.dtype, None), c=None, bias=None, sm_count=sm)
    return out


def launches_for(roots: dict, p, a, w, outs):
    """One Engine2Launch of plan p per variant, each compiled from its root."""
    out = {}
    for v, root in roots.items():
        with UseRoot(root):
            out[v] = engine.Engine2Launch(a, w.t(), outs[v][0], bias=None, c=None, plan=p)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--pick", default="mid64",
                    choices=("mid64", "broad", "streamed", "moe", "small", "splitk", "stream", "decode"))
    ap.add_argument("--limit", type=int, default=24)
    ap.add_argument("--variants", default="base,divergent")
    ap.add_argument("--shapes", default=None,
                    help='--pick decode only: "M,N,K;..." instead of the broad set\'s (any K: rows at any address '
                         'run the unaligned variants)')
    args = ap.parse_args()
    names = args.variants.split(",")
    roots = {}
    for v in names:
        parts.PATCHES[f"variant-{v}"] = VARIANTS[v]
        roots[v] = parts.patched_root(f"variant-{v}")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    gains = {v: [] for v in names}
    with open(args.out, "a") as out:
        if args.pick == "moe":
            moe(roots, out, l2, gains)
        else:
            if args.shapes and args.pick == "decode":
                todo = [(s.strip(), *map(int, s.split(","))) for s in args.shapes.split(";") if s.strip()]
            elif args.shapes:
                raise SystemExit("--shapes goes with --pick decode")
            else:
                todo = decode_shapes(args.limit) if args.pick == "decode" else shapes(args.pick, args.limit)
            if args.pick != "decode":
                for v in names:
                    parts.precompile([gemmlab.plan(M, N, K).plan for _, M, N, K in todo], roots[v])
            for name, M, N, K in todo:
                p = gemmlab.plan(M, N, K).plan
                n = sets_for(2 * (M * K + N * K + M * N), l2)
                xs = [torch.randn(M, K, device="cuda").bfloat16() for _ in range(n)]
                ws = [torch.randn(N, K, device="cuda").bfloat16() for _ in range(n)]
                outs = {v: [torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
                            for _ in range(n)] for v in names}
                launches = (decode_launches(roots, xs[0], ws[0], outs) if args.pick == "decode"
                            else launches_for(roots, p, xs[0], ws[0], outs))
                if args.pick == "decode":
                    p = f"decode kernel {launches[names[0]].plan}"
                runs, errs = checked_runs(launches, xs, ws, outs)
                res = time_interleaved({"torch": lambda i: torch.mm(xs[i], ws[i].t()), **runs}, n)
                tile = "decode" if args.pick == "decode" else f"{p.bm}x{p.bn}"
                report(out, name, f"{M}x{N}x{K} {tile}", p, res, errs, gains,
                       {"M": M, "N": N, "K": K, "baseline": "torch.mm"})
    for v in names:
        g = 1.0
        for x in gains[v]:
            g *= x
        print(f"{v}: x{g ** (1 / len(gains[v])):.4f} over base (geomean of {len(gains[v])}), "
              f"min {min(gains[v]):.3f} max {max(gains[v]):.3f}")


if __name__ == "__main__":
    main()
