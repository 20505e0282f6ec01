"""Probe: a consumer whose 64-row blocks lie past the tile's rows multiplies nothing (``consume_unit``'s
``active``, kernels/common/mainloop.cuh). Each plan built twice in one process: compiled with NO_ROW_SKIP=0
("skip") and with NO_ROW_SKIP=1 ("full": every consumer multiplies every k-step; the shipped default until
the skip has passed its GPU tests), checked against an fp32
reference and timed with the baseline interleaved by the project's timer (graph replay, inputs rotating
over 2x the L2). Dense: plans whose last row of tiles leaves a consumer's blocks empty; grouped: MoE shapes
with uneven routing (grouped_bench's), each group's last tile. One JSON line per plan to argv[1].

    python benchmarks/probes/probe_row_skip.py OUT.jsonl [all|dense|moe]
"""
import json
import os
import sys

import torch

sys.path.insert(0, "benchmarks")
from grouped_bench import shape_seed, uneven_offsets  # noqa: E402

from gemmlab import engine, grouped, planner  # noqa: E402
from gemmlab.gpu import sample_clocks  # noqa: E402
from gemmlab.jit import compiler  # noqa: E402
from gemmlab.jit.launch import raw_stream  # noqa: E402
from gemmlab.timer import sets_for, time_interleaved  # noqa: E402

# (M, N, K, bm, bn, schedule): the tile's last row leaves its second consumer (or half) empty.
DENSE = [(64, 4096, 3584, 128, 64, "split_k"), (300, 1600, 6400, 128, 64, "data_parallel"),
         (3000, 1024, 3072, 128, 208, "data_parallel"), (2050, 3000, 1000, 128, 224, "data_parallel"),
         (320, 4096, 4096, 128, 128, "data_parallel"), (5000, 5120, 14336, 128, 256, "stream_k")]
GROUPED = [("mixtral", "gate_up", 8, 28672, 4096, 4096), ("mixtral", "down", 8, 4096, 14336, 4096),
           ("mixtral22b", "gate_up", 8, 32768, 6144, 512), ("qwen_moe", "gate_up", 60, 2816, 2048, 16384)]


class Defines:
    """compile_kernel with extra defines while active (the engine's and the grouped kernel's compiles)."""

    def __init__(self, defines):
        self.defines = defines

    def __enter__(self):
        self.plain, extra = compiler.compile_kernel, self.defines

        def compile_kernel(*args, **kw):
            return self.plain(*args, defines={**(kw.pop("defines", None) or {}), **extra}, **kw)

        compiler.compile_kernel = engine.compile_kernel = compile_kernel

    def __exit__(self, *exc):
        compiler.compile_kernel = engine.compile_kernel = self.plain


def record(out, name, t, errs, extra):
    rec = {"suite": "row-skip-probe", "case": name, "skip_ms": t["skip"], "full_ms": t["full"],
           "baseline_ms": t["base"], "skip_over_full": t["full"] / t["skip"], "ratio_skip": t["base"] / t["skip"],
           "ratio_full": t["base"] / t["full"], "rel_error": errs, "sm_clock_mhz": sample_clocks().sm_mhz,
           "git_sha": os.environ.get("GEMMLAB_GIT_SHA"), **extra}
    print(f"{name:40s} skip {t['skip'] * 1e3:9.2f} full {t['full'] * 1e3:9.2f} base {t['base'] * 1e3:9.2f} us"
          f"  skip/full speed x{t['full'] / t['skip']:.3f}", flush=True)
    out.write(json.dumps(rec) + "\n")
    out.flush()


def checked_runs(launches, xs, ws, outs):
    """Each prepared dense launch (name -> engine.Engine2Launch of xs[i] @ ws[i].t() into outs[name][i]) run
    once on set 0 and checked against an fp32 reference; returns ({name: fn(i)} for the timer, {name:
    relative error}). The stream is taken at call time: the timer captures on its own stream."""
    dev = torch.cuda.current_device()
    ref = xs[0].float() @ ws[0].t().float()
    errs = {}
    for v, L in launches.items():
        L.run(raw_stream(dev), xs[0], ws[0].t(), outs[v][0], None, None, 1.0, 0.0)
        torch.cuda.synchronize()
        errs[v] = ((outs[v][0].float() - ref).norm() / ref.norm()).item()
        assert errs[v] < 2e-2, (v, errs[v])

    def run(v):
        L = launches[v]
        return lambda i: L.run(raw_stream(dev), xs[i], ws[i].t(), outs[v][i], None, None, 1.0, 0.0)

    return {v: run(v) for v in launches}, errs


def dense(out, l2):
    for M, N, K, bm, bn, schedule in DENSE:
        p = min((c for c in planner.candidates(M, N, K) if (c.bm, c.bn, c.schedule) == (bm, bn, schedule)
                 and not c.swap_ab and c.mcast == 1), key=lambda c: c.predicted_s)
        n = sets_for(2 * (M * K + N * K + M * N), l2)
        xs = [torch.randn(M, K, device="cuda").bfloat16() for _ in range(n)]
        ws = [torch.randn(N, K, device="cuda").bfloat16() for _ in range(n)]
        outs = {v: [torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(n)]
                for v in ("skip", "full")}
        with Defines({"NO_ROW_SKIP": "0"}):
            launches = {"skip": engine.Engine2Launch(xs[0], ws[0].t(), outs["skip"][0], bias=None, c=None, plan=p)}
        with Defines({"NO_ROW_SKIP": "1"}):
            launches["full"] = engine.Engine2Launch(xs[0], ws[0].t(), outs["full"][0], bias=None, c=None, plan=p)
        runs, errs = checked_runs(launches, xs, ws, outs)
        res = time_interleaved({"base": lambda i: torch.mm(xs[i], ws[i].t()), **runs}, n)
        record(out, f"{M}x{N}x{K} {bm}x{bn} {schedule}", {k: v.median_ms for k, v in res.timings.items()}, errs,
               {"M": M, "N": N, "K": K, "plan": repr(p), "baseline": "torch.mm"})


def moe_cases(l2, variants, shapes=None):
    """Per GROUPED shape (or per shape of ``shapes``, the same tuples): (model, proj, G, N, K, T, offs, sizes, plan, sets, xs, ws, outs, ref): uneven
    routing, the grouped plan, input sets rotating over 2x the L2, NaN-poisoned outputs per variant and
    the fp32 reference of set 0."""
    for n_, (model, proj, G, N, K, T) in enumerate(shapes or GROUPED):
        offs, sizes = uneven_offsets(G, T, shape_seed(model, proj, T, n_))
        p = grouped.plan("contiguous", G, T, N, K)
        n = sets_for(2 * (T * K + G * N * K + T * N), l2)
        xs = [torch.randn(T, K, device="cuda").bfloat16() for _ in range(n)]
        ws = [torch.randn(G, N, K, device="cuda").bfloat16() / 8 for _ in range(n)]
        outs = {v: [torch.full((T, N), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(n)]
                for v in variants}
        ref = torch.cat([xs[0][offs[g]:offs[g + 1]].float() @ ws[0][g].float().t() for g in range(G)])
        yield model, proj, G, N, K, T, offs, sizes, p, n, xs, ws, outs, ref


def moe(out, l2):
    for model, proj, G, N, K, T, offs, sizes, p, n, xs, ws, outs, ref in moe_cases(l2, ("skip", "full")):
        errs = {}
        for v in ("skip", "full"):
            with Defines({"NO_ROW_SKIP": "1" if v == "full" else "0"}):
                grouped.launch(p, xs[0], ws[0], offs, 1, outs[v][0])
            torch.cuda.synchronize()
            errs[v] = ((outs[v][0].float() - ref).norm() / ref.norm()).item()
            assert errs[v] < 2e-2, (v, errs[v])

        def run(v):
            d = {"NO_ROW_SKIP": "1" if v == "full" else "0"}

            def f(i):
                with Defines(d):
                    grouped.launch(p, xs[i], ws[i], offs, 1, outs[v][i])
            return f

        def base(i):
            torch._grouped_mm(xs[i], ws[i].transpose(1, 2), offs=offs[1:])

        res = time_interleaved({"base": base, "skip": run("skip"), "full": run("full")}, n)
        record(out, f"{model} {proj} T={T}", {k: v.median_ms for k, v in res.timings.items()}, errs,
               {"model": model, "proj": proj, "G": G, "N": N, "K": K, "T": T, "group_sizes": sizes,
                "plan": repr(p), "baseline": "torch._grouped_mm"})


def main():
    out = open(sys.argv[1], "a")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    which = sys.argv[2] if len(sys.argv) > 2 else "all"
    if which in ("all", "dense"):
        dense(out, l2)
    if which in ("all", "moe"):
        moe(out, l2)


if __name__ == "__main__":
    main()
