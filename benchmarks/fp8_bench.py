"""Time gemmlab's FP8 GEMM (kernels/engine/gemm_fp8.cu) against cuBLAS FP8 and a bf16 reference, interleaved.

    PYTHONPATH=src python3 benchmarks/fp8_bench.py --out $OUT/fp8.jsonl [--shapes "4096,4096,4096;..."]
        [--promote 1,2,4] [--tiles 128x128,128x192] [--rounds 15] [--budget-s 400] [--compile-only]

Per shape (default: squares 4096 / 8192 / 16384 and LLM prefill projections at M = 2048 and 8192, issue
18's bar set), candidates timed in one ``gemmlab.timer.time_interleaved`` run:

* ``ours_tensor``: ``gemmlab.scaled_mm``'s plan with per-tensor scales (and ``ours_tensor_p<k>`` for each
  other ``--promote`` interval);
* ``cublas_tensor``: ``torch._scaled_mm`` on the same operands and scales (cuBLAS FP8, per-tensor);
* ``ours_block``: 1 x 128 / 128 x 128 block scales;
* ``ours_tensor_<BM>x<BN>`` / ``ours_block_<BM>x<BN>``: each ``--tiles`` tile in both modes (where the
  plan space has it; block scales also forced onto widths the planner does not offer them on), to tell
  the scales' cost from the tile's;
* ``torch_block_ref``: what a user without a block-scaled kernel runs: dequantize both operands to bf16
  (scales applied in fp32) and ``torch.mm``; and ``torch_mm_bf16``: the ``torch.mm`` alone on operands
  dequantized once (a floor for that reference).

Inputs are fresh randn quantized to e4m3, rotated over sets of 2x the L2. Every candidate is checked
against an fp32 reference of the dequantized inputs (tf32 off) before it is timed; a failing one is
recorded with its error and not timed. One JSON line per (shape, candidate): git sha, GPU, SM clocks (the
run's and the candidate's own), shape, time, TFLOP/s, the baseline (``cublas_tensor`` for per-tensor
candidates, ``torch_block_ref`` for block ones) and the ratio, the plan and its predicted time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import time
from pathlib import Path

import torch

from gemmlab import engine2, fp8, planner
from gemmlab.bench import git_sha, rel_error
from gemmlab.gpu import gpu_info
from gemmlab.timer import sets_for, time_interleaved

SQUARES = [(n, n, n) for n in (4096, 8192, 16384)]
# Llama-3-8B / -70B projections (N, K): qkv-like, up / gate, down; at prefill batches of 2048 and 8192 tokens.
PREFILL = [(m, n, k) for m in (2048, 8192) for n, k in ((6144, 4096), (14336, 4096), (4096, 14336), (8192, 28672))]


def _shapes(arg: str | None) -> list[tuple[int, int, int]]:
    if not arg:
        return SQUARES + PREFILL
    return [tuple(int(x) for x in s.split(",")) for s in arg.split(";")]


def _dequant_bf16(x: torch.Tensor, scale: torch.Tensor, rows: int) -> torch.Tensor:
    """Dequantize on the GPU (the timed reference's work), as a user would write it: each row's (K / 128)
    scales broadcast over their 128 columns, in fp32, then bf16. rows: 1 (A's 1 x 128) or 128 (B's
    128 x 128 blocks: the (ceil(N / 128), K / 128) scales repeated to N rows first, a small tensor)."""
    R, K = x.shape
    s = scale if rows == 1 else scale.repeat_interleave(rows, dim=0)[:R]
    return (x.float().view(R, K // 128, 128) * s[:, :, None]).view(R, K).to(torch.bfloat16)


def plans_for(M: int, N: int, K: int, tiles: str, promotes: list[int], prof) -> dict[str, planner.Fp8Plan]:
    """The candidates' plans for one shape, by candidate name (the planner's picks, then each ``--tiles``
    tile in both scale modes where the plan space has it; block scales also forced onto tiles the planner
    does not offer them on)."""
    plans = {f"ours_tensor{'' if p == promotes[0] else f'_p{p}'}":
             planner.plan_fp8(M, N, K, scale="tensor", promote=p, profile=prof) for p in promotes}
    plans["ours_block"] = planner.plan_fp8(M, N, K, scale="block", profile=prof)
    for tile in filter(None, tiles.split(",")):  # --tiles: the same tile in both modes, side by side
        bm, bn = (int(v) for v in tile.split("x"))
        tensor = [p for p in planner.fp8_candidates(M, N, K, profile=prof) if (p.bm, p.bn) == (bm, bn)]
        if not tensor:
            continue
        plans[f"ours_tensor_{bm}x{bn}"] = tensor[0]
        block = [p for p in planner.fp8_candidates(M, N, K, scale="block", profile=prof) if (p.bm, p.bn) == (bm, bn)]
        stages = planner.fp8_stages_for(bm, bn, "block")
        if block or stages:
            plans[f"ours_block_{bm}x{bn}"] = block[0] if block else dataclasses.replace(
                tensor[0], scale="block", stages=stages)
    return plans


def compile_only(shapes, tiles: str, promotes: list[int], prof) -> None:
    """Compile every plan the run would time (into GEMMLAB_CACHE_DIR), on all CPU cores: run it beside
    something else on the GPU so the timed run starts warm. Workers are spawned (this process holds a
    CUDA context; compiling needs none)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    plans = {p.name_expression: p for s in shapes for p in plans_for(*s, tiles, promotes, prof).values()}
    with ProcessPoolExecutor(max_workers=min(len(plans), os.cpu_count() or 1),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        for p, _ in zip(plans.values(), pool.map(engine2.compile_fp8_plan, plans.values())):
            print(f"compiled {p.compiled_name}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "benchmarks/results"), "fp8.jsonl"))
    ap.add_argument("--shapes", default=None, help='"M,N,K;M,N,K" (default: squares and prefill shapes)')
    ap.add_argument("--promote", default="1", help="per-tensor promotion intervals to time (k-steps of 128)")
    ap.add_argument("--tiles", default="", help='also time these tiles in both scale modes, e.g. "128x128,128x192"')
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--replay-ms", type=float, default=20.0)
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop between shapes after this long")
    ap.add_argument("--compile-only", action="store_true", help="compile the plans (in parallel), time nothing")
    args = ap.parse_args()
    t_start = time.perf_counter()
    torch.backends.cuda.matmul.allow_tf32 = False
    info = gpu_info()
    prof = engine2._profile(torch.device("cuda"))
    promotes = [int(x) for x in args.promote.split(",")]
    sha = git_sha()
    shapes = _shapes(args.shapes)
    if args.compile_only:
        compile_only(shapes, args.tiles, promotes, prof)
        return
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    ratios: dict[str, list[float]] = {}
    for n, (M, N, K) in enumerate(shapes):
        if time.perf_counter() - t_start > args.budget_s:
            print(f"budget reached after {n} of {len(shapes)} shapes", flush=True)
            break
        n_sets = max(1, min(sets_for(M * K + N * K + 2 * M * N, info.l2_bytes), 8))
        sets = []
        for i in range(n_sets):
            x = torch.randn(M, K, device="cuda")
            w = torch.randn(N, K, device="cuda")
            at, sat = fp8.quantize_per_tensor(x)
            wt, sbt = fp8.quantize_per_tensor(w)
            ab, sab = fp8.quantize_blocks(x, 1)
            wb, sbb = fp8.quantize_blocks(w, 128)
            out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
            sets.append(dict(at=at, sat=sat, wt=wt, sbt=sbt, ab=ab, sab=sab, wb=wb, sbb=sbb, out=out,
                             wdq=fp8.dequantize(wb, sbb, dtype=torch.float32).to(torch.bfloat16),
                             adq=fp8.dequantize(ab, sab, dtype=torch.float32).to(torch.bfloat16)))
            del x, w
        s0 = sets[0]
        refs = {"tensor": fp8.reference_scaled_mm(s0["at"], s0["wt"].t(), s0["sat"], s0["sbt"], dtype=torch.float32),
                "block": fp8.reference_scaled_mm(s0["ab"], s0["wb"].t(), s0["sab"], s0["sbb"], dtype=torch.float32)}
        plans = plans_for(M, N, K, args.tiles, promotes, prof)

        def ours(name, pl):
            key = "t" if pl.scale == "tensor" else "b"

            def run(i):
                s = sets[i]
                engine2.launch_fp8(pl, s["a" + key], s["w" + key], s["sa" + key], s["sb" + key], s["out"])
                return s["out"]
            return run

        runs = {name: ours(name, pl) for name, pl in plans.items()}
        # cuBLAS allocates its output (the caching allocator: no copy is timed beside it).
        runs["cublas_tensor"] = lambda i: torch._scaled_mm(
            sets[i]["at"], sets[i]["wt"].t(), scale_a=sets[i]["sat"], scale_b=sets[i]["sbt"], out_dtype=torch.bfloat16)
        runs["torch_block_ref"] = lambda i: torch.mm(
            _dequant_bf16(sets[i]["ab"], sets[i]["sab"], 1), _dequant_bf16(sets[i]["wb"], sets[i]["sbb"], 128).t(),
            out=sets[i]["out"])
        runs["torch_mm_bf16"] = lambda i: torch.mm(sets[i]["adq"], sets[i]["wdq"].t(), out=sets[i]["out"])
        errors, cands = {}, {}
        for name, fn in runs.items():
            ref = refs["tensor" if "tensor" in name else "block"]
            s0["out"].fill_(float("nan"))
            try:
                got = fn(0)
                torch.cuda.synchronize()
                errors[name] = rel_error(got, ref.double())
            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                errors[name] = f"{type(e).__name__}: {e}"[:300]
            if isinstance(errors[name], float) and errors[name] <= 1e-2:
                cands[name] = fn
        res = time_interleaved(cands, n_sets, rounds=args.rounds, replay_ms=args.replay_ms)
        times = {k: t.median_ms for k, t in res.timings.items()}
        flop = 2.0 * M * N * K
        line = f"[{n + 1}/{len(shapes)}] {M}x{N}x{K}"
        with open(args.out, "a") as f:
            for name in runs:
                base_name = "cublas_tensor" if "tensor" in name else "torch_block_ref"
                t, base = times.get(name), times.get(base_name)
                ratio = base / t if t and base and name != base_name else None
                if ratio:
                    ratios.setdefault(name, []).append(ratio)
                if t:
                    line += f"  {name} {flop / t / 1e9:6.0f}" + (f" ({ratio:.3f}x)" if ratio else "")
                pl = plans.get(name)
                rec = {"suite": "fp8", "M": M, "N": N, "K": K, "candidate": name, "time_ms": t,
                       "tflops": flop / t / 1e9 if t else None, "baseline": base_name, "baseline_ms": base,
                       "ratio": ratio, "rel_error": errors[name], "correct": t is not None,
                       "sm_clock_mhz": res.clocks.sm_mhz,
                       "kernel_sm_clock_mhz": res.clocks_by_name[name].sm_mhz if name in res.clocks_by_name else None,
                       "gpu": info.name, "sm_count": info.sm_count, "git_sha": sha, "torch": torch.__version__}
                if name == "ours_block" and t and times.get("ours_tensor"):
                    rec["vs_ours_tensor"] = times["ours_tensor"] / t  # bar: >= 0.9 (scaling nearly free)
                    ratios.setdefault("block_vs_ours_tensor", []).append(rec["vs_ours_tensor"])
                if pl is not None:
                    rec.update(plan=repr(pl), bm=pl.bm, bn=pl.bn, stages=pl.stages, grid=pl.grid, scale=pl.scale,
                               promote=pl.promote, predicted_ms=pl.predicted_s * 1e3)
                f.write(json.dumps(rec) + "\n")
        print(line + f"  (TFLOP/s; SM {res.clocks.sm_mhz} MHz)", flush=True)
        sets = s0 = refs = None  # free this shape's operands before the next shape's
        torch.cuda.empty_cache()
    for name, rs in sorted(ratios.items()):
        geo = math.exp(statistics.fmean(math.log(r) for r in rs))
        print(f"{name:18s} geomean {geo:.3f}x over {len(rs)} shapes (min {min(rs):.3f}, max {max(rs):.3f})")
    print("bars (issue 18): ours_tensor >= 1.05x cublas_tensor; ours_block >= 1.0x torch_block_ref on every "
          "shape; block_vs_ours_tensor >= 0.9x")
    print(f"records: {args.out}")


if __name__ == "__main__":
    main()
