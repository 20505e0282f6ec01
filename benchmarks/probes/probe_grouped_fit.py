"""Probe: the fitted grouped kernel (kernels/engine/gemm_grouped_fit.cu) in its variants against the grouped pick.

    PYTHONPATH=src python3 benchmarks/probes/probe_grouped_fit.py $OUT/grouped_fit_probe.jsonl

The kernel swaps the operands (128 or 256 weight rows x W tokens a tile) and fits each group's token tiles to its
rows on the device (W a multiple of Q up to WMAX; the planner's forms are fit_q16 and fitpp128_q16). On grouped_bench's uneven
routing (same seeds; the routes follow PROBE_GROUPED's order as grouped_bench's --shapes do) of the shapes in PROBE_GROUPED (model:T pairs,
default the many-expert shapes where the pick pads the most), each width set is checked against an fp32
reference on poisoned outputs, then timed interleaved with ``grouped_mm``'s pick, ``torch._grouped_mm`` and
a loop of ``torch.mm`` (graph replay, one input set: the weights, 0.5-2 GB, stream from HBM regardless).
One JSON line per (shape, candidate).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import grouped_bench as gb  # noqa: E402

from gemmlab import grouped  # noqa: E402
from gemmlab.bench import git_sha, rel_error  # noqa: E402
from gemmlab.gpu import gpu_info  # noqa: E402
from gemmlab.jit.compiler import compile_kernel  # noqa: E402
from gemmlab.jit.launch import launch, tensor_map_2d  # noqa: E402
from gemmlab.timer import time_interleaved  # noqa: E402

SOURCE = "engine/gemm_grouped_fit.cu"
TRAITS = ("GemmTraits<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, {bm}, {wmax}, {stages}, false, false, false, false, 0, "
          "true, {sched}, true>")
# name: (weight rows a tile, WMAX, stages, Q, MAX_G, schedule: 0 data-parallel, 3 ping-pong, store: 0 one epilogue a
# width, 1 SHARED_STORE, else STORE_STEP).
# fit256: two consumers of 128 weight rows (each k16 step two wgmmas against one token slab: the L2 bytes per
# output of the tiled 128 x 256 at W = 128), 4 stages beside a 64-group table; fitpp128: ping-pong consumers
# of 128 weight rows, each epilogue under the other's k-loop; _shared: one epilogue at WMAX for every width
# (SHARED_STORE: 2.8-3.7 k SASS instructions against 6-10.7 k with one a width; the tiled kernel's 2.8-3.0 k).
# Session 31's variants (fit256, fitpp128, _shared) were timed at 0be9b20 (grouped_fit_probe.jsonl); fitpp128_q16
# led and is planned (grouped.FIT_PINGPONG_OFFERED). fitpp176_q16 (session 60): the same form with token tiles up
# to 176 wide (11 widths; the kernel holds up to grouped.FIT_MAP_SLOTS), the dense planner's swapped 128 x 176
# ping-pong per expert that the torch.mm loop's rivals run (docs/worklog.md, session 29).
VARIANTS = {"fit_q16": (128, 128, 5, 16, 128, 0, 0), "fitpp256_q32": (64, 256, 4, 32, 128, 3, 0),
            "fit_q16_g512": (128, 128, 4, 16, 512, 0, 0), "fit256_q16": (256, 128, 4, 16, 64, 0, 0),
            "fitpp128_q16": (128, 128, 5, 16, 128, 3, 0), "fit_q16_shared": (128, 128, 5, 16, 128, 0, 1),
            "fit256_q16_shared": (256, 128, 4, 16, 64, 0, 1), "fitpp128_q16_shared": (128, 128, 5, 16, 128, 3, 1),
            "fitpp256_q32_shared": (64, 256, 4, 32, 128, 3, 1), "fitpp176_q16": (128, 176, 5, 16, 128, 3, 0),
            "fitpp176_q16_shared": (128, 176, 5, 16, 128, 3, 1), "fitpp176_q16_s64": (128, 176, 5, 16, 128, 3, 64),
            "fitpp128_q16_s64": (128, 128, 5, 16, 128, 3, 64), "fit_q16_s64": (128, 128, 5, 16, 128, 0, 64),
            "fitpp176_q16_l64": (128, 176, 5, 16, 128, 3, 0, 64), "fitpp176_q16_l128": (128, 176, 5, 16, 128, 3, 0, 128),
            "fitpp176_q16_s64_l64": (128, 176, 5, 16, 128, 3, 64, 64),
            "fitpp176_q16_s64_l128": (128, 176, 5, 16, 128, 3, 64, 128),
            "fitpp176_q16_s64_p64c25": (128, 176, 5, 16, 128, 3, 64, 64, 25),
            "fitpp176_q16_s64_p64c50": (128, 176, 5, 16, 128, 3, 64, 64, 50),
            "fitpp176_q16_p64c50": (128, 176, 5, 16, 128, 3, 0, 64, 50),
            "fitpp176_q16_s64_last64": (128, 176, 5, 16, 128, 3, 64, 64, -2),
            "fitpp176_q16_last64": (128, 176, 5, 16, 128, 3, 0, 64, -2),
            "fitpp176_q16_last128": (128, 176, 5, 16, 128, 3, 0, 128, -2),
            "fitpp176_q16_first64": (128, 176, 5, 16, 128, 3, 0, 64, -1),
            "fitpp176_q16_wide": (128, 176, 5, 16, 128, 3, 0, 0, 0, True),
            "fitpp176_q16_s64_wide": (128, 176, 5, 16, 128, 3, 64, 0, 0, True),
            "fitpp176_q16_wide_claim": (128, 176, 5, 16, 128, 3, 0, 0, 0, True, True),
            "fitpp176_q16_claim": (128, 176, 5, 16, 128, 3, 0, 0, 0, False, True)}
# fitpp176_q16_shared (session 61): one epilogue for every width at 176 (5.3 k SASS lines against 18.3 k), for the
# 176-wide form's loss at K <= 2048 (docs/worklog.md, session 61: code size or fixed costs a tile).
# _s64 (the last field 64: the kernel's STORE_STEP): one epilogue a bucket of widths (16..64 stored at 64, 80..128
# at 128, 144..176 at 176; 6.9 k SASS instructions at 176 against 17.1 k plain and 4.8 k shared). fit_q16_s64:
# the data-parallel form (few rows a group) in steps of 64 (timed in session 62: within 1.5% of fit_q16).
# _l64 / _l128 (an eighth field: the kernel's LIGHT, session 62): groups of 1 .. LIGHT rows (HBM-bound: their
# weight streams once under little MMA) as a class of their own, its tiles spread evenly among the others'
# (FitTable's interleaved order), so a wave runs both kinds at once instead of one after the other (measured
# slower: 0.94-0.96x). _p64c25 / _p64c50 (a ninth field: LIGHT_COST): the light class on CTAs of its own instead,
# as many as a light tile's cost (25 / 50% of a heavy tile's) gives it, its weight loads evict-first (measured
# slower: 0.35-1.04x; with PROBE_SPLIT_LIGHT, the light groups cost 0.6-2.0x their time alone inside the whole
# launch). _last64 / _first64 (LIGHT_COST -2 / -1): the light class as one phase after / before the heavy one.
# _wide (a tenth field: WIDEST_FIRST; session 62 as LIGHT_COST -3, one warp scan a width; session 63 the kernel's
# three-sweep table): every group by its token tiles' width, the widest first (the last wave the narrowest).
# _claim (an eleventh field: CLAIM, session 63): each CTA's tiles after its first claimed from a counter (the
# kernel's module global), so the tiles in flight stay consecutive; with _wide, longest-first list scheduling.
# Measured (H100, 3791eb1): x0.975 with _wide at 8-16 experts (DBRX gate/up 481 against 518 TFLOP/s), x1.001 at
# 64-128: refuted, not offered.
# PROBE_VARIANTS: a comma-separated subset of VARIANTS (default all). PROBE_ROUTING=even: every group T / G rows
# (the remainder one more each on the first groups) instead of grouped_bench's uneven routing, so at up to 128
# rows a group every width set runs the same token tiles. PROBE_SPLIT_LIGHT=L: the first variant also as <name>_heavy
# (the groups of more than L rows alone: the others emptied) and <name>_light (only those of 1 .. L rows), timed
# beside the whole: whether the light groups' HBM-bound tiles cost their own time (whole ~ heavy + light) or
# run under the others' (whole ~ heavy).
DEFAULT = "qwen2_57b:8192,olmoe:8192,qwen3_30b:8192,dsv2lite:4096,qwen_moe:16384,dsv3:4096,mixtral:4096,dbrx:8192"


def chosen() -> dict:
    names = os.environ.get("PROBE_VARIANTS")
    return VARIANTS if not names else {n: VARIANTS[n] for n in names.split(",")}


def fit_runner(a, b, offs, bm, wmax, stages, q, max_g, sched, shared, light=0, light_cost=0, widest=False,
               claim=False):
    """A launcher of the draft for these operands (maps built once)."""
    G, N, K = b.shape
    T = a.shape[0]
    traits = TRAITS.format(bm=bm, wmax=wmax, stages=stages, sched=sched)
    store = {0: "", 1: ", true"}.get(shared, f", false, {shared}")
    if light or widest or claim:
        store = (f", {'true' if shared == 1 else 'false'}, {0 if shared == 1 else shared}, "
                 f"{'true' if widest else 'false'}, {light}, {light_cost}{', true' if claim else ''}")
    ne = f"engine_gemm_grouped_fit<{traits}, {max_g}, {q}{store}>"
    k = compile_kernel(SOURCE, ne, arch="sm_90a")
    b2 = b.reshape(G * N, K)
    map_w = tensor_map_2d(b2, (bm, 64))
    maps_t = [tensor_map_2d(a, (w, 64)) for w in range(q, wmax + 1, q)]
    maps_t += [maps_t[0]] * (grouped.FIT_MAP_SLOTS - len(maps_t))
    smem = 1024 + stages * (bm + wmax) * 64 * 2 + 2 * 2 * 64 * 128
    tiles = sum(-(-int(r) // wmax) for r in (offs[1:] - offs[:-1]).tolist()) * -(-N // bm)
    grid = max(1, min(gpu_info().sm_count, tiles))

    def run(o):
        args = (map_w, *maps_t, offs, np.int32(1), np.int32(G), np.int32(T), np.int32(N), np.int32(K), o,
                np.int64(o.stride(0)))
        launch(k, grid=grid, block=384, smem=smem, args=args)
        return o

    return run


def check_edges() -> list[str]:
    """The draft on ragged groups (0, 1, 15 .. 300 rows), N not a multiple of 128, K not of 64, against an
    fp32 reference on NaN-poisoned outputs: one line per (variant, case)."""
    lines = []
    for sizes, N, K in [([0, 1, 15, 16, 17, 127, 128, 129, 300, 0, 2], 200, 104), ([5, 0, 0, 250], 384, 4096),
                        ([64] * 40, 1000, 192)]:
        G, T = len(sizes), sum(sizes)
        offs = torch.tensor([0] + np.cumsum(sizes).tolist(), dtype=torch.int32, device="cuda")
        a = torch.randn(T, K, device="cuda").to(torch.bfloat16)
        b = (torch.randn(G, N, K, device="cuda") / K ** 0.5).to(torch.bfloat16)
        ref = grouped.reference_grouped_mm(a, b, offs, dtype=torch.float32)
        for name, v in chosen().items():
            if G > v[4]:  # MAX_G
                continue
            o = torch.full((T, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            fit_runner(a, b, offs, *v)(o)
            torch.cuda.synchronize()
            err = rel_error(o.double(), ref.double())
            lines.append(f"edge {name} sizes={sizes} N={N} K={K}: rel_error {err:.2e} {'ok' if err <= 1e-2 else 'FAIL'}")
    return lines


def main() -> None:
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ.get("OUT", "."), "grouped_fit_probe.jsonl")
    info, sha = gpu_info(), git_sha()
    for line in check_edges():
        print(line, flush=True)
    pairs = os.environ.get("PROBE_GROUPED", DEFAULT).split(",")
    todo = [sh for pair in pairs for sh in gb.shapes([pair.split(":")[0]], [int(pair.split(":")[1])])]
    for n, (model, proj, G, N, K, T) in enumerate(todo):
        if os.environ.get("PROBE_ROUTING") == "even":
            sizes = [T // G + (g < T % G) for g in range(G)]
            offs = torch.tensor([0] + np.cumsum(sizes).tolist(), dtype=torch.int32, device="cuda")
        else:
            offs, sizes = gb.uneven_offsets(G, T, seed=gb.shape_seed(model, proj, T, n))
        a = torch.randn(T, K, device="cuda").to(torch.bfloat16)
        b = (torch.randn(G, N, K, device="cuda") / K ** 0.5).to(torch.bfloat16)
        outs = {}
        ref = grouped.reference_grouped_mm(a, b, offs, dtype=torch.float32)
        plan = grouped.plan_for(a, b, offs)
        ends = offs[1:].contiguous()
        runs = {"ours": lambda o: grouped.run(a, b, offs, out=o, plan=plan),
                "torch_grouped_mm": lambda o: o.copy_(torch._grouped_mm(a, b.transpose(-2, -1), ends))}
        starts = [0] + torch.tensor(sizes).cumsum(0).tolist()

        def loop(o):  # one torch.mm per non-empty expert (sizes on the host: what a loop would sync for)
            for g in range(G):
                if sizes[g]:
                    torch.mm(a[starts[g]:starts[g + 1]], b[g].t(), out=o[starts[g]:starts[g + 1]])
            return o

        runs["torch_mm_loop"] = loop
        for name, v in chosen().items():
            if G <= v[4] and (v[4] < 512 or G > 128):  # the 512-group table only where 128 is too small
                runs[name] = fit_runner(a, b, offs, *v)
        checks = {name: (ref, T) for name in runs}  # each run's reference and rows
        split = int(os.environ.get("PROBE_SPLIT_LIGHT", "0"))
        for part in ("heavy", "light") if split else ():  # the same groups' rows, the other class's emptied
            ps = [s if (s > split) == (part == "heavy") else 0 for s in sizes]
            if not sum(ps):
                continue
            offs_p = torch.tensor([0] + np.cumsum(ps).tolist(), dtype=torch.int32, device="cuda")
            a_p = a[:sum(ps)]
            ref_p = grouped.reference_grouped_mm(a_p, b, offs_p, dtype=torch.float32)
            for name, v in list(chosen().items())[:1]:  # the first variant only (a class alone runs no mixing)
                if G <= v[4] and (v[4] < 512 or G > 128):
                    runs[f"{name}_{part}"] = fit_runner(a_p, b, offs_p, *v)
                    checks[f"{name}_{part}"] = (ref_p, sum(ps))
        errors, cands = {}, {}
        for name, fn in runs.items():
            ref_n, rows_n = checks[name]
            o = torch.full((rows_n, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            try:
                fn(o)
                torch.cuda.synchronize()
                errors[name] = rel_error(o.double(), ref_n.double())
            except Exception as e:  # noqa: BLE001
                errors[name] = f"{type(e).__name__}: {e}"[:300]
            outs[name] = torch.empty(rows_n, N, device="cuda", dtype=torch.bfloat16)
            if isinstance(errors[name], float) and errors[name] <= 1e-2:  # (torch timed without the check's copy)
                cands[name] = ((lambda i: torch._grouped_mm(a, b.transpose(-2, -1), ends)) if name == "torch_grouped_mm"
                               else (lambda f, o: (lambda i: f(o)))(fn, outs[name]))
        res = time_interleaved(cands, 1, rounds=9)
        times = {k: t.median_ms for k, t in res.timings.items()}
        line = f"[{n + 1}/{len(todo)}] {model} {proj} G={G} T={T}"
        with open(out_path, "a") as f:
            for name in runs:
                t = times.get(name)
                flop = 2.0 * checks[name][1] * N * K
                base = times.get("torch_grouped_mm")
                line += f"  {name} " + (f"{flop / t / 1e9:.0f} ({base / t:.3f}x)" if t and base else str(errors[name])[:60])
                f.write(json.dumps({"probe": "grouped_fit", "model": model, "proj": proj, "groups": G, "N": N, "K": K,
                                    "T": T, "candidate": name, "time_ms": t, "tflops": flop / t / 1e9 if t else None,
                                    "ratio_to_torch_grouped_mm": base / t if t and base else None,
                                    "rel_error": errors[name], "plan": repr(plan) if name == "ours" else name,
                                    "sm_clock_mhz": res.clocks.sm_mhz,
                                    "routing": os.environ.get("PROBE_ROUTING", "uneven"), "rows": checks[name][1],
                                    "split_light": split,
                                    "gpu": info.name, "git_sha": sha}) + "\n")
        print(line, flush=True)


if __name__ == "__main__":
    main()
