"""Run the grouped kernel once per tile and schedule on small ragged groups, for compute-sanitizer.

    compute-sanitizer --tool memcheck --leak-check no --report-api-errors no python3 benchmarks/grouped_sanitize.py
    compute-sanitizer --tool racecheck python3 benchmarks/grouped_sanitize.py --only bf16

(cuda-core's descriptor code probes the driver with cuGetProcAddress for entry points it may lack: memcheck
reports those as API errors unless told not to, as tests/test_sanitizer_gpu.py does.)

Group sizes on both sides of every short A box (8, 16, 32, 64, 128 rows) and of whole tiles, an empty group
among them; bf16 with K-major and MN-major b (and the fitted form, data-parallel and ping-pong, each listed
at other rows a group, on the same groups), the masked layout, and e4m3 with per-tensor and block scales.
Each run prints the plan and its relative error against the float64 reference (``grouped.reference_grouped_mm``); a run whose output is
wrong, or writes rows outside the groups (NaN-poisoned), says so and the script exits 1.
"""

import argparse
import dataclasses
import sys

import torch

from gemmlab import fp8, grouped
from gemmlab.bench import rel_error

SIZES = [1, 8, 9, 16, 17, 31, 33, 64, 65, 100, 127, 128, 0, 129, 200, 255, 257]


def cases():
    """(name, a, b, offsets, counts, scale_a, scale_b, candidates' keyword arguments)."""
    G, N, K = len(SIZES), 136, 512
    T = sum(SIZES)
    offs = torch.zeros(G + 1, dtype=torch.int64)
    offs[1:] = torch.cumsum(torch.tensor(SIZES), 0)
    offs = offs.to(torch.int32).cuda()
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(T, K, device="cuda", generator=g).bfloat16()
    w = torch.randn(G, N, K, device="cuda", generator=g) / K ** 0.5
    yield "bf16", a, w.bfloat16(), offs, None, None, None, {}
    wt = (torch.randn(G, K, N, device="cuda", generator=g) / K ** 0.5).bfloat16()
    yield "bf16 MN-major b", a, wt.transpose(1, 2), offs, None, None, None, {"b_mn": True}
    C = max(SIZES)
    am = torch.randn(G, C, K, device="cuda", generator=g).bfloat16()
    counts = torch.tensor(SIZES, dtype=torch.int32).cuda()
    yield "bf16 masked", am, w.bfloat16(), None, counts, None, None, {}
    qa, sa = fp8.quantize_per_tensor(torch.randn(T, K, device="cuda", generator=g))
    qb, sb = fp8.quantize_per_tensor(w)
    yield "e4m3 tensor", qa, qb, offs, None, sa, sb, {"dtype": "e4m3"}
    ba, bsa = fp8.quantize_blocks(torch.randn(T, K, device="cuda", generator=g), 1)
    bb, bsb = fp8.quantize_expert_blocks(w, 128)
    yield "e4m3 block", ba, bb, offs, None, bsa, bsb, {"dtype": "e4m3", "scale": "block"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None, help="comma-separated case names (bf16, bf16 MN-major b, bf16 masked, "
                                                 "e4m3 tensor, e4m3 block)")
    ap.add_argument("--fit-only", action="store_true", help="only the fitted form's plans")
    args = ap.parse_args()
    only = None if args.only is None else set(args.only.split(","))
    grouped.MN_MAJOR_B_OFFERED = True
    failed = 0
    for name, a, b, offs, counts, sa, sb, kw in cases():
        if only is not None and name not in only:
            continue
        layout = "masked" if counts is not None else "contiguous"
        G, N, K = b.shape
        rows = a.shape[1] if counts is not None else a.shape[0]
        seen = set()
        cands = [] if args.fit_only else grouped.candidates(layout, G, rows, N, K, **kw)
        dt, b_mn = kw.get("dtype", "bf16"), kw.get("b_mn", False)
        if grouped.fit_kernel_problem(layout, dt, "bf16", b_mn, G, rows) is None:
            # the fitted form, both schedules (listed elsewhere: few rows a group; ping-pong, many): any rows
            cands += [grouped.fitted_plan(layout, G, rows, N, K, schedule=s, **kw) for s in grouped.FIT_SCHEDULES]
            # and ping-pong in both tile orders (widest first: the kernel's WIDEST_FIRST table)
            cands += [grouped.fitted_plan(layout, G, rows, N, K, schedule="pingpong", widest_first=w, **kw)
                      for w in (False, True)]
        for c in cands:
            key = (c.bm, c.bn, c.schedule, c.fit, c.widest_first)
            if key in seen:
                continue
            seen.add(key)
            p = c if c.fit else dataclasses.replace(c, direct=False)  # (the fitted form stores every row itself)
            out = torch.full((*a.shape[:-1], N), float("nan"), device="cuda", dtype=torch.bfloat16)
            grouped.run(a, b, offs, counts=counts, out=out, plan=p, scale_a=sa, scale_b=sb)
            ref = grouped.reference_grouped_mm(a, b, offs, counts=counts, scale_a=sa, scale_b=sb)
            torch.cuda.synchronize()
            inside = ~torch.isnan(ref[..., 0])
            err = rel_error(out[inside].double(), ref[inside])
            outside = bool(torch.isnan(out[~inside]).all())
            ok = err < 2e-2 and outside
            failed += not ok
            print(f"{'ok ' if ok else 'BAD'} {name}: {p!r}: rel error {err:.2e}"
                  + ("" if outside else ", rows outside the groups written"), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
