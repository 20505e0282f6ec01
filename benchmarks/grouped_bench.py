"""Time gemmlab's grouped GEMM (kernels/engine/gemm_grouped.cu) against torch._grouped_mm and a loop of torch.mm.

    PYTHONPATH=src python3 benchmarks/grouped_bench.py --out $OUT/grouped.jsonl [--models mixtral,dsv3]
        [--tokens 256,4096,16384] [--rounds 15] [--budget-s 400]

MoE expert GEMMs of public models, (experts, N, K) of the up/gate projection (N = 2 x intermediate when
gate and up are fused) and the down projection:

* Mixtral-8x7B: 8 experts, hidden 4096, intermediate 14336;
* DeepSeek-V2-Lite: 64 routed experts, hidden 2048, intermediate 1408;
* DeepSeek-V3: 256 routed experts, hidden 7168, intermediate 2048;
* Qwen1.5-MoE-A2.7B: 60 experts, hidden 2048, intermediate 1408;

at a number of routed token-rows T (tokens x top-k), split over the experts unevenly: seeded, skewed
(uniform^2 weights) sizes with some experts empty, as routers produce. Candidates, timed in one
``gemmlab.timer.time_interleaved`` run (CUDA graphs, interleaved rounds, rotated input sets):

* ``ours``: ``gemmlab.grouped.run`` with the plan ``grouped_mm`` picks (and, with ``--all-tiles``,
  ``ours_<bm>x<bn>`` for every other tile ``grouped.candidates`` prices, ``ours_fit`` / ``ours_fit_pp`` the
  fitted form (``grouped.FIT_KERNEL``; data-parallel / ping-pong consumers) where listed, ``ours_<bm>x<bn>_sk``
  its stream-K plan (bf16 / fp16), so the planner's pick can be checked
  against measurement, and ``ours_no_panel`` where the picked plan's panels split the tallest group:
  the same plan walking each group plain m-fastest; ``--no-panel`` adds only that one; ``--group-order``
  adds ``ours_group_order`` where the pick orders its tiles widest first: the same plan in group order, and
  ``ours_widest_first`` where the pick is the ping-pong fitted form in group order: the same plan widest
  first); with ``--fitted`` (cheaper), only the picks' rivals of
  the other kernel: ``ours_fit`` / ``ours_fit_pp`` (``grouped.fitted_plan``: either schedule wherever the
  fitted kernel runs the problem, listed or not) unless picked, and ``ours_tiled`` (``grouped.tiled_plan``:
  the tiled kernel's pick) where the pick is a fitted form;
* ``torch_grouped_mm``: ``torch._grouped_mm(a, b.transpose(-2, -1), offs)`` where torch has it (bf16);
* ``torch_mm_loop``: one ``torch.mm`` per non-empty expert on its rows (the sizes read on the host before
  timing: this candidate is given what a real loop would have to sync for);
* with ``--gemmlab-loop``, ``gemmlab_mm_loop``: the same loop through ``gemmlab.matmul`` (the dense engine's
  plan per expert), to tell the grouped kernel's own cost from what the shapes cost;
* with ``--fp8``, ``ours_fp8``: the same inputs quantized to e4m3 (a per-tensor scale for a, one per expert
  for b), ``grouped_mm``'s FP8 plan; checked against the fp32 product of its dequantized inputs. And block
  scales (DeepSeek-V3's: a 1 x 128 per row, each expert 128 x 128): ``ours_fp8_block``, ``grouped_mm``'s
  block-scaled plan, and ``torch_dequant_mm_loop``, what torch offers for them: per non-empty expert its
  rows and its weight dequantized to bf16 and one ``torch.mm`` (the honest baseline: ``torch._grouped_mm``
  takes no block scales); both checked against the fp32 product of the block-dequantized inputs.

Each candidate is checked against an fp32 reference (per expert ``torch.mm`` in fp32) before it is timed;
a failing one is recorded with its error and not timed. One JSON line per (shape, candidate): git sha, GPU,
SM clocks, model, experts, N, K, T, time, TFLOP/s (of the rows really multiplied), ratio to
torch._grouped_mm (or to the loop where torch has none), the plan (tile, stages, group-table size, panel,
DIRECT or TMA stores) and its predicted time, and the shape's roofline: max(HBM bytes (A, the non-empty
experts' weights, out) at ``--peak-tbs``, FLOP at ``--peak-tflops``), with ``best_ratio`` = the baseline's
time over it, the most any kernel could beat the baseline by on this GPU's data sheet.

    # the H200 check of the large-T fix (~90 s): the losing shapes, every tile, and a 256-expert one
    PYTHONPATH=src python3 benchmarks/grouped_bench.py --all-tiles --rounds 9 --budget-s 75 \
        --shapes mixtral:4096,mixtral:16384,qwen_moe:16384,dsv2lite:16384,dsv3:4096 --out $OUT/grouped_tiles.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path

import dataclasses

import torch

import gemmlab
from gemmlab import fp8, grouped
from gemmlab.bench import git_sha, rel_error
from gemmlab.gpu import gpu_info
from gemmlab.timer import sets_for, time_interleaved

# name: (experts, hidden, intermediate)
MODELS = {"mixtral": (8, 4096, 14336), "dsv2lite": (64, 2048, 1408), "dsv3": (256, 7168, 2048),
          "qwen_moe": (60, 2048, 1408)}
# Never tuned on: models outside the default suite, for --models / --shapes (Mixtral 8x22B, DBRX,
# Qwen2-57B-A14B, OLMoE-1B-7B, Qwen3-30B-A3B; public configs).
EXTRA_MODELS = {"mixtral22b": (8, 6144, 16384), "dbrx": (16, 6144, 10752), "qwen2_57b": (64, 3584, 2560),
                "olmoe": (64, 2048, 1024), "qwen3_30b": (128, 2048, 768)}


def shapes(models, tokens):
    """(model, proj, G, N, K, T): the fused gate/up projection (N = 2 I, K = H) and down (N = H, K = I)."""
    for m in models:
        G, H, I = MODELS[m] if m in MODELS else EXTRA_MODELS[m]
        for T in tokens:
            yield m, "gate_up", G, 2 * I, H, T
            yield m, "down", G, H, I, T


def uneven_offsets(G, T, seed, device="cuda"):
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(G, generator=g) ** 2
    w[torch.randperm(G, generator=g)[: G // 8]] = 0  # an eighth of the experts get no tokens
    sizes = torch.floor(w / w.sum() * T).long()
    sizes[int(torch.argmax(w))] += T - int(sizes.sum())
    offs = torch.zeros(G + 1, dtype=torch.int64)
    offs[1:] = torch.cumsum(sizes, 0)
    return offs.to(torch.int32).to(device), sizes.tolist()


DEFAULT_TOKENS = (256, 4096, 16384)
SUFFIX = {"data_parallel": "", "stream_k": "_sk", "pingpong": "_pp"}  # --all-tiles' names of the schedules


def shape_seed(model, proj, T, n):
    """The group sizes' seed: the shape's position in the default list (every model x DEFAULT_TOKENS), so
    a run of a subset (--shapes) routes the same rows as the full run; else its position in this run."""
    full = [(m, p, t) for m, p, _, _, _, t in shapes(MODELS, DEFAULT_TOKENS)]
    return full.index((model, proj, T)) if (model, proj, T) in full else n


def grouped_profile(a):
    """The device profile grouped.plan_for prices with (the GPU's own)."""
    from gemmlab.engine2 import _profile

    return _profile(a.device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "benchmarks/results"), "grouped.jsonl"))
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"of {list(MODELS)} (the suite) and {list(EXTRA_MODELS)}")
    ap.add_argument("--tokens", default="256,4096,16384", help="routed token-rows T (tokens x top-k)")
    ap.add_argument("--shapes", default=None,
                    help="model:T pairs (e.g. mixtral:16384,dsv3:4096) instead of --models x --tokens")
    ap.add_argument("--all-tiles", action="store_true", help="also time every other tile of the plan space")
    ap.add_argument("--fitted", action="store_true",
                    help="also time the fitted forms (ours_fit, ours_fit_pp) and the tiled pick (ours_tiled) "
                         "beside the pick, where they are not it")
    ap.add_argument("--fp8", action="store_true", help="also time the FP8 grouped kernel on the inputs quantized")
    ap.add_argument("--gemmlab-loop", action="store_true", help="also time a loop of gemmlab.matmul over the experts")
    ap.add_argument("--no-panel", action="store_true",
                    help="also time ours_no_panel (as --all-tiles does) where the pick's panels split the tallest group")
    ap.add_argument("--claim", action="store_true",
                    help="also time the pick with its tiles in claim order (GroupedPlan.claim), as ours_claim")
    ap.add_argument("--group-order", action="store_true",
                    help="also time ours_group_order where the pick orders its tiles widest first "
                         "(GroupedPlan.widest_first): the same plan in group order; and ours_widest_first where "
                         "the pick is the ping-pong fitted form in group order: the same plan widest first")
    ap.add_argument("--peak-tbs", type=float, default=4.8, help="HBM peak for the roofline (H200: 4.8 TB/s)")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H200: 989 TFLOP/s)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--replay-ms", type=float, default=20.0)
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop between shapes after this long")
    args = ap.parse_args()
    t_start = time.perf_counter()
    torch.backends.cuda.matmul.allow_tf32 = False
    info = gpu_info()
    sha = git_sha()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    ratios: dict[str, list[float]] = {}
    sub_ratios: dict[str, list[float]] = {}  # block scales: ours against the dequantize loop and our per-tensor
    if args.shapes:
        todo = [sh for pair in args.shapes.split(",") for sh in shapes([pair.split(":")[0]], [int(pair.split(":")[1])])]
    else:
        todo = list(shapes(args.models.split(","), [int(x) for x in args.tokens.split(",")]))
    has_torch = hasattr(torch, "_grouped_mm")
    for n, (model, proj, G, N, K, T) in enumerate(todo):
        if time.perf_counter() - t_start > args.budget_s:
            print(f"budget reached after {n} of {len(todo)} shapes", flush=True)
            break
        offs, sizes = uneven_offsets(G, T, seed=shape_seed(model, proj, T, n))
        n_sets = max(1, min(sets_for(2 * (T * K + G * N * K + T * N), info.l2_bytes), 4))
        sets = [dict(a=torch.randn(T, K, device="cuda").to(torch.bfloat16),
                     b=(torch.randn(G, N, K, device="cuda") / K ** 0.5).to(torch.bfloat16),
                     out=torch.empty(T, N, device="cuda", dtype=torch.bfloat16)) for _ in range(n_sets)]
        s0 = sets[0]
        ref = torch.empty(T, N, device="cuda", dtype=torch.float32)
        starts = [0] + list(torch.tensor(sizes).cumsum(0).tolist())
        for g in range(G):
            if sizes[g]:
                ref[starts[g]:starts[g + 1]] = s0["a"][starts[g]:starts[g + 1]].float() @ s0["b"][g].float().t()
        plan = grouped.plan_for(s0["a"], s0["b"], offs)
        plans = {"ours": plan}
        if args.claim and grouped.claimable(plan.bm, plan.bn, plan.dtype, plan.schedule):
            plans["ours_claim"] = dataclasses.replace(plan, claim=True)
        if args.all_tiles:
            for c in grouped.candidates("contiguous", G, T, N, K, profile=grouped_profile(s0["a"])):
                if (c.bm, c.bn, c.schedule, c.fit) != (plan.bm, plan.bn, plan.schedule, plan.fit):
                    plans[f"ours_fit{SUFFIX[c.schedule]}" if c.fit else f"ours_{c.bm}x{c.bn}{SUFFIX[c.schedule]}"] = c
        if (args.all_tiles or args.no_panel) and not plan.fit and max(sizes) > plan.panel * plan.bm:
            plans["ours_no_panel"] = dataclasses.replace(plan, panel=1 << 30)  # the tallest group is walked in panels
        if args.group_order and plan.widest_first:
            plans["ours_group_order"] = dataclasses.replace(plan, widest_first=False)
        elif args.group_order and plan.fit and plan.schedule == "pingpong":
            plans["ours_widest_first"] = dataclasses.replace(plan, widest_first=True)
        if args.fitted:
            prof = grouped_profile(s0["a"])
            if grouped.fit_kernel_problem("contiguous", "bf16", "bf16", False, G, T) is None:
                for schedule in grouped.FIT_SCHEDULES:
                    if not (plan.fit and plan.schedule == schedule):
                        plans[f"ours_fit{SUFFIX[schedule]}"] = grouped.fitted_plan("contiguous", G, T, N, K,
                                                                                   schedule=schedule, profile=prof)
            if plan.fit:
                plans["ours_tiled"] = grouped.tiled_plan("contiguous", G, T, N, K, profile=prof)

        refs = {}
        if args.fp8:  # e4m3 copies of every set: a per-tensor scale for a, one per expert for b
            for s in sets:
                s["a8"], s["sa"] = fp8.quantize_per_tensor(s["a"].float())
                qs = [fp8.quantize_per_tensor(s["b"][g].float()) for g in range(G)]
                s["b8"], s["sb"] = torch.stack([q for q, _ in qs]), torch.stack([x.reshape(()) for _, x in qs])
            plans["ours_fp8"] = grouped.plan_for(s0["a8"], s0["b8"], offs, scale_a=s0["sa"], scale_b=s0["sb"])
            refs["ours_fp8"] = grouped.reference_grouped_mm(s0["a8"], s0["b8"], offs, scale_a=s0["sa"],
                                                            scale_b=s0["sb"], dtype=torch.float32)
            for s in sets:  # block scales, in the quantizers' MN-major layout (read in place)
                s["a8b"], s["sab"] = fp8.quantize_blocks(s["a"], 1)
                s["b8b"], s["sbb"] = fp8.quantize_expert_blocks(s["b"], 128)
            plans["ours_fp8_block"] = grouped.plan_for(s0["a8b"], s0["b8b"], offs, scale_a=s0["sab"],
                                                       scale_b=s0["sbb"])
            refs["ours_fp8_block"] = refs["torch_dequant_mm_loop"] = grouped.reference_grouped_mm(
                s0["a8b"], s0["b8b"], offs, scale_a=s0["sab"], scale_b=s0["sbb"], dtype=torch.float32)

        def ours(pl):
            def run(i):
                s = sets[i]
                if pl.dtype == "e4m3" and pl.scale == "block":
                    return grouped.run(s["a8b"], s["b8b"], offs, out=s["out"], plan=pl, scale_a=s["sab"],
                                       scale_b=s["sbb"])
                if pl.dtype == "e4m3":
                    return grouped.run(s["a8"], s["b8"], offs, out=s["out"], plan=pl, scale_a=s["sa"], scale_b=s["sb"])
                return grouped.run(s["a"], s["b"], offs, out=s["out"], plan=pl)
            return run

        runs = {name: ours(pl) for name, pl in plans.items()}
        if has_torch:
            ends = offs[1:].contiguous()
            runs["torch_grouped_mm"] = lambda i: torch._grouped_mm(sets[i]["a"], sets[i]["b"].transpose(-2, -1), ends)

        def loop(mm):  # one mm(a_g, w_g^T, out=out_g) per non-empty expert
            def run(i):
                s = sets[i]
                for g in range(G):
                    if sizes[g]:
                        r = slice(starts[g], starts[g + 1])
                        mm(s["a"][r], s["b"][g].t(), out=s["out"][r])
                return s["out"]
            return run

        runs["torch_mm_loop"] = loop(torch.mm)
        if args.gemmlab_loop:
            runs["gemmlab_mm_loop"] = loop(gemmlab.matmul)

        def dequant_loop(i):  # block scales without a grouped kernel: dequantize each expert, then torch.mm
            s = sets[i]
            for g in range(G):
                if sizes[g]:
                    r = slice(starts[g], starts[g + 1])
                    x = fp8.dequantize(s["a8b"][r], s["sab"][r], dtype=torch.float32).to(torch.bfloat16)
                    w = fp8.dequantize(s["b8b"][g], s["sbb"][g], dtype=torch.float32).to(torch.bfloat16)
                    torch.mm(x, w.t(), out=s["out"][r])
            return s["out"]

        if args.fp8:
            runs["torch_dequant_mm_loop"] = dequant_loop
        errors, cands = {}, {}
        for name, fn in runs.items():
            s0["out"].fill_(float("nan"))
            try:
                got = fn(0)
                torch.cuda.synchronize()
                errors[name] = rel_error(got.double(), refs.get(name, ref).double())
            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                errors[name] = f"{type(e).__name__}: {e}"[:300]
            if isinstance(errors[name], float) and errors[name] <= 1e-2:
                cands[name] = fn
        res = time_interleaved(cands, n_sets, rounds=args.rounds, replay_ms=args.replay_ms)
        times = {k: t.median_ms for k, t in res.timings.items()}
        base_name = "torch_grouped_mm" if "torch_grouped_mm" in times else "torch_mm_loop"
        flop = 2.0 * T * N * K
        hbm = 2.0 * (T * K + sum(1 for x in sizes if x) * N * K + T * N)
        roof_ms = max(hbm / (args.peak_tbs * 1e12), flop / (args.peak_tflops * 1e12)) * 1e3
        line = f"[{n + 1}/{len(todo)}] {model} {proj} G={G} N={N} K={K} T={T}"
        with open(args.out, "a") as f:
            for name in runs:
                t, base = times.get(name), times.get(base_name)
                ratio = base / t if t and base and name != base_name else None
                if ratio:
                    ratios.setdefault(name, []).append(ratio)
                if t:
                    line += f"  {name} {flop / t / 1e9:6.0f}" + (f" ({ratio:.3f}x)" if ratio else "")
                rec = {"suite": "grouped", "model": model, "proj": proj, "groups": G, "N": N, "K": K, "T": T,
                       "empty_groups": sum(1 for s in sizes if s == 0), "max_group_rows": max(sizes),
                       "candidate": name, "time_ms": t, "tflops": flop / t / 1e9 if t else None,
                       "baseline": base_name, "baseline_ms": base, "ratio": ratio, "rel_error": errors[name],
                       "correct": t is not None, "roofline_ms": roof_ms,
                       "best_ratio": base / roof_ms if base else None, "sm_clock_mhz": res.clocks.sm_mhz,
                       "kernel_sm_clock_mhz": res.clocks_by_name[name].sm_mhz if name in res.clocks_by_name else None,
                       "gpu": info.name, "sm_count": info.sm_count, "git_sha": sha, "torch": torch.__version__,
                       "flush_bytes": res.flush_bytes}
                pl = plans.get(name)
                if pl is not None:
                    rec.update(plan=repr(pl), bm=pl.bm, bn=pl.bn, stages=pl.stages, grid=pl.grid, table=pl.table,
                               panel=min(pl.panel, 1 << 30), direct=pl.direct, predicted_ms=pl.predicted_s * 1e3,
                               scale=pl.scale if pl.dtype == "e4m3" else None)
                if name == "ours_fp8_block" and t:  # against what torch offers for block scales, and our per-tensor
                    for other in ("torch_dequant_mm_loop", "ours_fp8"):
                        if times.get(other):
                            rec[f"ratio_vs_{other}"] = times[other] / t
                            sub_ratios.setdefault(f"ours_fp8_block / {other}", []).append(times[other] / t)
                f.write(json.dumps(rec) + "\n")
        print(line + f"  (TFLOP/s; SM {res.clocks.sm_mhz} MHz; roofline {flop / roof_ms / 1e9:.0f}, at most "
              f"{times[base_name] / roof_ms if base_name in times else float('nan'):.2f}x {base_name})", flush=True)
        sets = s0 = ref = None
        torch.cuda.empty_cache()
    for name, rs in sorted(ratios.items()) + sorted(sub_ratios.items()):
        geo = math.exp(statistics.fmean(math.log(r) for r in rs))
        print(f"{name:18s} geomean {geo:.3f}x over {len(rs)} shapes (min {min(rs):.3f}, max {max(rs):.3f})")
    print(f"records: {args.out}")


if __name__ == "__main__":
    main()
