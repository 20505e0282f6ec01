"""Where an h11 launch spends its time: a per-CTA timeline of the engine's kernel on chosen plans.

    PYTHONPATH=src python3 benchmarks/h11_timeline.py --cases "512,1024,4096;512,1024,4096@128x3" --out t.jsonl

A case is ``M,N,K`` (the engine's own plan) or ``M,N,K@BNxSPLITS``. The kernel is rebuilt with
``TIMELINE_BUF`` defined (``kernels/common/timeline.cuh``): thread 0 of the producer and of the first
consumer record %globaltimer and clock64 at eight events (0 entry, 1 first loads issued, 2 first stage
landed, 3 k-loop done, 4 partial written, 5 partials visible to the cluster, 6 rows reduced and stored,
7 done; 4-6 only with split-K). Each case is launched ``--repeats`` times after a warm-up; each launch
gives per-phase medians and maxima over the CTAs, and the record keeps the median launch. The same plan
without the probe and torch.mm are timed with the project's timer for scale. A persistent (unsplit)
launch that runs several tiles per CTA keeps only its last tile's events 2 and 3.

An experiment, not a suite: records carry ``suite = "h11-timeline"``.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from gemmlab import autotune, engine
from gemmlab.bench import git_sha
from gemmlab.gpu import gpu_info, sample_clocks
from gemmlab.jit import compiler
from gemmlab.timer import sets_for, time_interleaved

PHASES = {  # name: (from event, to event)
    "first_load_us": (0, 2),
    "kloop_us": (2, 3),
    "write_partial_us": (3, 4),
    "cluster_wait_us": (4, 5),
    "reduce_store_us": (5, 6),
    "final_barrier_us": (6, 7),
    "cta_total_us": (0, 7),
}
MAX_CTAS = 8192


def parse_case(text: str) -> tuple[tuple[int, int, int], tuple[int, int] | None]:
    shape, _, plan = text.partition("@")
    M, N, K = (int(x) for x in shape.split(","))
    return (M, N, K), (tuple(int(x) for x in plan.split("x")) if plan else None)


# --ab-full-a-box: the A/B candidate loads 64 rows of A for tiles past M + 64, as before a_rows_loaded.
FULL_A_BOX = {"a_rows_loaded": lambda M, a_mn: 64}


def run(a, b, out, plan, buf=None, source=None, patch=None) -> None:
    """engine.gemm with ``plan`` (or the engine's own), with ``buf`` the probe build, with ``source``
    another copy of the kernel, with ``patch`` engine attributes replaced (an A/B)."""
    saved = engine.compile_kernel, engine.SOURCE
    saved_attrs = {k: getattr(engine, k) for k in (patch or {})}
    for k, v in (patch or {}).items():
        setattr(engine, k, v)
    if source is not None:
        engine.SOURCE = source
    if buf is not None:
        def probe_compile(source, expr, **kw):
            if source == engine.SOURCE:
                kw.update(defines={"TIMELINE_BUF": f"{buf.data_ptr():#x}ull"}, use_disk_cache=False)
            return compiler.compile_kernel(source, expr, **kw)
        engine.compile_kernel = probe_compile
    try:
        engine.gemm(a, b, out, plan=plan)
    finally:
        engine.compile_kernel, engine.SOURCE = saved
        for k, v in saved_attrs.items():
            setattr(engine, k, v)


def summarize(raw: torch.Tensor, ctas: int, ns_per_clock: float) -> dict:
    """Per-phase median and max over the CTAs (us, from %globaltimer; ``*_clk_us`` from clock64 at the
    sampled SM clock), and the span from the first entry to the last exit."""
    ev = raw.view(ctas, 8, 3).cpu()
    ns, clk = ev[:, :, 0].double(), ev[:, :, 1].double()
    seen = (ev[:, :, 0] != 0)
    out: dict = {"ctas": ctas}
    t0 = ns[:, 0].min()
    out["entry_spread_us"] = float((ns[:, 0].max() - t0) / 1e3)
    out["span_us"] = float((ns[:, 7][seen[:, 7]].max() - t0) / 1e3) if seen[:, 7].any() else None
    for name, (e0, e1) in PHASES.items():
        ok = seen[:, e0] & seen[:, e1]
        if not ok.any():
            continue
        d_ns = (ns[ok, e1] - ns[ok, e0]) / 1e3
        d_clk = (clk[ok, e1] - clk[ok, e0]) * ns_per_clock / 1e3
        out[name] = {"median": float(d_ns.median()), "max": float(d_ns.max()),
                     "clk_median": float(d_clk.median()), "clk_max": float(d_clk.max())}
    done = ns[:, 7][seen[:, 7]]
    if done.numel():
        out["exit_spread_us"] = float((done.max() - done.min()) / 1e3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", required=True, help="M,N,K[@BNxSPLITS];...")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=None)
    p.add_argument("--ab", default=None, help="another h11 source under kernels/ (e.g. hopper/_ab_old.cu): "
                                              "timed beside the current one and torch.mm")
    p.add_argument("--ab-full-a-box", action="store_true",
                   help="the A/B candidate is this kernel loading 64 rows of A for short tiles")
    args = p.parse_args()
    info, sha = gpu_info(), git_sha()
    sm = info.sm_count
    # One buffer for every case: its address is compiled into the probe build, so each instantiation
    # compiles once.
    buf_all = torch.zeros(MAX_CTAS * 8 * 3, dtype=torch.int64, device="cuda")
    for text in args.cases.split(";"):
        (M, N, K), plan = parse_case(text)
        a = torch.randn(M, K, device="cuda").bfloat16()
        b = torch.randn(N, K, device="cuda").bfloat16().t()
        out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        used = plan or engine.plan_for(M, N, K, sm, lambda: engine.cluster_capacity(a.device),
                                       gpu=autotune.device_gpu(a.device.index or 0))
        tiles = -(-M // engine.BM) * -(-N // used[0])
        ctas = tiles * used[1] if used[1] > 1 else min(sm, tiles)
        if ctas > MAX_CTAS:
            raise SystemExit(f"{text}: {ctas} CTAs, more than the probe's {MAX_CTAS}")
        buf = buf_all[:ctas * 8 * 3]
        launches = []
        for i in range(args.repeats + 2):
            run(a, b, out, used, buf_all if i else None)  # the first: the plain kernel, to warm the caches
            torch.cuda.synchronize()
            clocks = sample_clocks()
            if i >= 2:
                launches.append(summarize(buf, ctas, 1e3 / (clocks.sm_mhz or 1980)))
            buf_all.zero_()
        ref = a.double() @ b.double()
        err = float((out.double() - ref).norm() / ref.norm())

        n_sets = max(1, min(sets_for(2 * (M * K + N * K + M * N), info.l2_bytes), 64))
        sets = [(torch.randn(M, K, device="cuda").bfloat16(), torch.randn(N, K, device="cuda").bfloat16().t(),
                 torch.empty(M, N, device="cuda", dtype=torch.bfloat16)) for _ in range(n_sets)]
        cands = {"torch": lambda i: torch.mm(sets[i][0], sets[i][1], out=sets[i][2]),
                 "h11": lambda i: run(*sets[i], used)}
        if args.ab_full_a_box:
            args.ab = args.ab or "full-a-box"
        ab_kw = {"patch": FULL_A_BOX} if args.ab_full_a_box else {"source": args.ab}
        if args.ab:
            cands["ab"] = lambda i: run(*sets[i], used, **ab_kw)
            sets[0][2].fill_(float("nan"))
            run(*sets[0], used, **ab_kw)
            ab_ref = sets[0][0].double() @ sets[0][1].double()
            ab_err = float((sets[0][2].double() - ab_ref).norm() / ab_ref.norm())
        res = time_interleaved(cands, n_sets, rounds=args.rounds, replay_ms=10.0)
        mid = sorted(launches, key=lambda r: r["span_us"] or 0)[len(launches) // 2]
        rec = {"suite": "h11-timeline", "git_sha": sha, "gpu": info.name, "sm_mhz": res.clocks.sm_mhz,
               "M": M, "N": N, "K": K, "BN": used[0], "splits": used[1], "engine_plan": plan is None,
               "rel_error": err, "h11_us": res.timings["h11"].median_ms * 1e3,
               "torch_us": res.timings["torch"].median_ms * 1e3,
               "spans_us": [r["span_us"] for r in launches], **mid}
        if args.ab:
            rec.update(ab_source=args.ab, ab_us=res.timings["ab"].median_ms * 1e3, ab_rel_error=ab_err)
        phases = "  ".join(f"{k[:-3]} {v['median']:.2f}/{v['max']:.2f}" for k, v in mid.items()
                           if isinstance(v, dict))
        print(f"{M}x{N}x{K} BN={used[0]} s={used[1]}: h11 {rec['h11_us']:.1f} us, torch {rec['torch_us']:.1f} us, "
              f"span {mid['span_us']:.1f}, entry spread {mid['entry_spread_us']:.2f} | {phases} "
              f"(err {err:.1e}, {res.clocks.sm_mhz} MHz)"
              + (f" | ab {rec['ab_us']:.1f} us (err {ab_err:.1e})" if args.ab else ""), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
