"""Probe for Nsight Compute: the grouped kernel against the loops on the 8-16-expert gate/up shapes where the
loops still win (issue 18's loop bar): for each shape, one launch of grouped_mm's pick (and of the pick with
its tiles in claim order), of 128 x 256
data-parallel and 128 x 128 ping-pong, then one loop of torch.mm and one of gemmlab.matmul over the experts
(one launch per non-empty expert). Compiled and warmed up first; only the launches between cudaProfilerStart
and cudaProfilerStop are profiled:

    ncu --clock-control none --profile-from-start off --set full -o $OUT/ncu_grouped \\
        python3 benchmarks/probes/probe_ncu_grouped.py ORDER [model:T,...] [--order-study]

ORDER (a text file this script writes) names the report's kernels in order, one per line. --order-study
(no loops): the pick's tile on the largest group alone (G = 1, against gemmlab.matmul's dense
kernel on the same rows), on G even groups of whole tiles (no block crosses a group's end), with panels
of one m-tile (n fastest), and with every block stored by the threads (even and ragged groups: no tile's
epilogue slower than another's): which of the group walk, the ragged ends, the order or CTAs drifting
apart costs L2 hits."""
import dataclasses
import os
import sys

import torch

sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemmlab  # noqa: E402
from plans_vs_torch import profile_launches  # noqa: E402
from gemmlab import grouped  # noqa: E402
from grouped_bench import grouped_profile, shape_seed, shapes, uneven_offsets  # noqa: E402

DEFAULT = "mixtral:4096,mixtral22b:512"


def order_study(tag, pick, a, b, out, sizes):
    G, T = b.shape[0], a.shape[0]
    calls = []
    big = max(range(G), key=lambda g: sizes[g])
    rows = sizes[big]
    one = grouped.candidates("contiguous", 1, rows, b.shape[1], b.shape[2])
    p1 = next(dataclasses.replace(c, panel=pick.panel) for c in one
              if (c.bm, c.bn, c.schedule) == (pick.bm, pick.bn, pick.schedule))
    offs1 = torch.tensor([0, rows], dtype=torch.int32, device="cuda")
    a1, b1, o1 = a[:rows], b[big:big + 1], out[:rows]
    calls.append((f"{tag} study G=1 rows {rows} {p1!r}",
                  lambda: grouped.run(a1, b1, offs1, out=o1, plan=p1)))
    calls.append((f"{tag} study dense gemmlab.matmul rows {rows}", lambda: gemmlab.matmul(a1, b[big].t(), out=o1)))
    even = torch.arange(0, G + 1, dtype=torch.int32, device="cuda") * (T // G)
    calls.append((f"{tag} study even groups of {T // G} rows {pick!r}",
                  lambda: grouped.run(a, b, even, out=out, plan=pick)))
    direct = dataclasses.replace(pick, direct=True)  # every block stored by the threads: no epilogue is slower
    calls.append((f"{tag} study even groups, every block direct {direct!r}",
                  lambda: grouped.run(a, b, even, out=out, plan=direct)))
    thin = dataclasses.replace(pick, panel=1)
    offs = torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    calls.append((f"{tag} study panel 1 (n fastest) {thin!r}", lambda: grouped.run(a, b, offs, out=out, plan=thin)))
    calls.append((f"{tag} study every block direct {direct!r}", lambda: grouped.run(a, b, offs, out=out, plan=direct)))
    return calls


def main():
    args = [x for x in sys.argv[1:] if not x.startswith("--")]
    study = "--order-study" in sys.argv
    order, pairs = args[0], (args[1] if len(args) > 1 else DEFAULT)
    calls = []
    for pair in pairs.split(","):
        model, T = pair.split(":")
        for n, (m, proj, G, N, K, T) in enumerate(shapes([model], [int(T)])):
            if proj != "gate_up":
                continue
            offs, sizes = uneven_offsets(G, T, seed=shape_seed(m, proj, T, n))
            a = torch.randn(T, K, device="cuda").bfloat16()
            b = (torch.randn(G, N, K, device="cuda") / K ** 0.5).bfloat16()
            out = torch.empty(T, N, device="cuda", dtype=torch.bfloat16)
            pick = grouped.plan_for(a, b, offs)
            plans = {"pick": pick}
            if grouped.claimable(pick.bm, pick.bn, pick.dtype, pick.schedule):
                plans["pick claimed"] = dataclasses.replace(pick, claim=True)
            for c in grouped.candidates("contiguous", G, T, N, K, profile=grouped_profile(a)):
                if (c.bm, c.bn, c.schedule) in ((128, 256, "data_parallel"), (128, 128, "pingpong")):
                    plans[f"{c.bm}x{c.bn} {c.schedule}"] = dataclasses.replace(c, panel=pick.panel)
            tag = f"{m} {proj} G={G} T={T} N={N} K={K} sizes={sizes}"
            for name, p in plans.items():
                calls.append((f"{tag} grouped {name} {p!r}",
                              lambda a=a, b=b, offs=offs, out=out, p=p: grouped.run(a, b, offs, out=out, plan=p)))
            if study and not any("study" in name for name, _ in calls):
                calls += order_study(tag, pick, a, b, out, sizes)
            starts = [0] + torch.tensor(sizes).cumsum(0).tolist()
            for label, mm in () if study else (("torch.mm", torch.mm), ("gemmlab.matmul", gemmlab.matmul)):
                for g in range(G):
                    if sizes[g]:
                        r = slice(starts[g], starts[g + 1])
                        calls.append((f"{tag} loop {label} expert {g} rows {sizes[g]}",
                                      lambda a=a[r], w=b[g].t(), o=out[r], mm=mm: mm(a, w, out=o)))
    profile_launches(calls, [], order)  # compiled and warmed up first, then one launch each


if __name__ == "__main__":
    main()
