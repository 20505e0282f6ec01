"""Probe: the grouped kernel against the dense engine on the same experts with the same tile. On the gate/up
projections of 8-expert models the grouped kernel runs 0.95-0.98x a loop of torch.mm while a loop of
gemmlab.matmul (the dense engine's plan per expert) beats that loop (session 27: Mixtral T = 4096, grouped
559 TFLOP/s, torch.mm loop 590, gemmlab.matmul loop 607), and the dense pick's tile measured in the grouped
kernel ran behind the grouped pick. Here, per shape (G experts of T / G rows each, even, so every loop runs
the same problem G times), one graph-replay run interleaves:
  grouped            gemmlab.grouped.run with grouped_mm's plan;
  grouped <tile>     the grouped kernel with the dense pick's tile and schedule, where it has it;
  dense loop         engine.gemm per expert with the dense planner's pick (what gemmlab.matmul runs);
  dense loop <tile>  engine.gemm per expert with the grouped pick's tile and schedule;
  torch loop         torch.mm per expert.
G = 1 compares the kernels on one problem (no group mixing), G = 8 the launch of all experts against eight.
One line per shape to argv[1].

    PYTHONPATH=src:benchmarks python3 benchmarks/probes/probe_grouped_vs_dense.py OUT.jsonl
    PROBE_SHAPES="G,T,N,K;..." (default: Mixtral 8x7B gate/up at T = 512 / 4096 with G = 1 and 8, DBRX's)
    PROBE_TILES="bm,bn,schedule;..." (also each tile in the grouped kernel and as a dense loop of it)
    PROBE_SPLIT=1 (with PROBE_UNEVEN, 128-row picks): also the pick over each group but a last tile of at most 64
        rows, and 64 x 256 ping-pong over those last rows, as two launches on parts packed apart beforehand
    PROBE_UNEVEN="model:T,..." (instead: grouped_bench.py's gate/up shapes with its uneven routing, drawn as
        session 27's run drew them; the loops then run each expert's own rows, the dense loop each expert's
        own pick, "dense loop <tile>" each expert with the grouped pick's tile)"""
import dataclasses
import json
import os
import sys

import torch

from gemmlab import engine, grouped, planner
from gemmlab.bench import git_sha, rel_error
from gemmlab.gpu import gpu_info
from gemmlab.timer import time_interleaved
from plans_vs_torch import shapes_from_env

SHAPES = [(1, 512, 28672, 4096), (8, 4096, 28672, 4096), (1, 1024, 21504, 6144), (8, 8192, 21504, 6144)]
SHAPES = shapes_from_env(SHAPES)  # PROBE_SHAPES="G,T,N,K;..." in its place


def tag(p) -> str:
    return f"{p.bm}x{p.bn} {p.schedule}"


SESSION27 = "mixtral22b:512,mixtral:4096,dbrx:8192,qwen_moe:4096,mixtral22b:8192,mixtral:16384"


def cases():
    """(G, T, N, K, group sizes): SHAPES with even groups, or PROBE_UNEVEN's shapes with grouped_bench's routing."""
    if not os.environ.get("PROBE_UNEVEN"):
        return [(G, T, N, K, [T // G] * G) for G, T, N, K in SHAPES]
    sys.path.insert(0, "benchmarks")
    from grouped_bench import shape_seed, shapes, uneven_offsets
    keep = set(os.environ["PROBE_UNEVEN"].split(","))
    full = [sh for pair in SESSION27.split(",") for sh in shapes([pair.split(":")[0]], [int(pair.split(":")[1])])]
    return [(G, T, N, K, uneven_offsets(G, T, seed=shape_seed(m, proj, T, n), device="cpu")[1])
            for n, (m, proj, G, N, K, T) in enumerate(full) if proj == "gate_up" and f"{m}:{T}" in keep]


def main():
    out_path = sys.argv[1]
    info = gpu_info()
    for G, T, N, K, sizes in cases():
        starts = [sum(sizes[:g]) for g in range(G + 1)]
        live = [g for g in range(G) if sizes[g]]
        a = torch.randn(T, K, device="cuda").bfloat16()
        b = (torch.randn(G, N, K, device="cuda") / K ** 0.5).bfloat16()
        out = torch.empty(T, N, device="cuda", dtype=torch.bfloat16)
        offs = torch.tensor(starts, device="cuda", dtype=torch.int32)
        ref = torch.full((T, N), float("nan"), device="cuda", dtype=torch.float64)
        for g in live:
            ref[starts[g]:starts[g + 1]] = (a[starts[g]:starts[g + 1]].float() @ b[g].float().t()).double()
        gp = grouped.plan_for(a, b, offs)
        dps = {g: planner.candidates(sizes[g], N, K)[0] for g in live}  # each expert's dense pick
        dp = dps[max(live, key=lambda g: sizes[g])]  # the largest expert's
        runs, plans = {"grouped": None, "torch loop": None}, {"grouped": repr(gp), "dense loop": repr(dp)}
        errors = {}
        runs["grouped"] = lambda i, p=gp: grouped.run(a, b, offs, out=out, plan=p)
        same = next((c for c in grouped.candidates("contiguous", G, T, N, K)
                     if (c.bm, c.bn, c.schedule) == (dp.bm, dp.bn, dp.schedule)), None)
        if same is not None and tag(same) != tag(gp) and not dp.swap_ab:
            runs[f"grouped {tag(same)}"] = lambda i, p=same: grouped.run(a, b, offs, out=out, plan=p)
            plans[f"grouped {tag(same)}"] = repr(same)

        def loop(mm, per):
            def run(i):
                for g in live:
                    r = slice(starts[g], starts[g + 1])
                    mm(a[r], b[g].t(), out[r], per[g])
                return out
            return run
        runs["dense loop"] = loop(lambda x, w, o, p: engine.gemm(x, w, o, plan=p), dps)
        twins = {g: next((c for c in planner.candidates(sizes[g], N, K, schedules=planner.SCHEDULES)
                          if (c.bm, c.bn, c.schedule, c.swap_ab, c.mcast) == (gp.bm, gp.bn, gp.schedule, False, 1)),
                         None) for g in live}
        if all(twins.values()) and any(tag(twins[g]) != tag(dps[g]) or dps[g].swap_ab for g in live):
            runs[f"dense loop {tag(gp)}"] = loop(lambda x, w, o, p: engine.gemm(x, w, o, plan=p), twins)
            plans[f"dense loop {tag(gp)}"] = repr(twins[live[0]])
        runs["torch loop"] = loop(lambda x, w, o, p: torch.mm(x, w, out=o), dps)
        # PROBE_TILES="128,176,pingpong;...": each tile both ways, in the grouped kernel and as a loop of the
        # dense engine with that tile for every expert (not swapped), where both have it.
        for spec in filter(None, os.environ.get("PROBE_TILES", "").split(";")):
            bm, bn, sched = spec.split(",")
            key = (int(bm), int(bn), sched)
            gq = next((c for c in grouped.candidates("contiguous", G, T, N, K) if (c.bm, c.bn, c.schedule) == key), None)
            dq = {g: next((c for c in planner.candidates(sizes[g], N, K, schedules=planner.SCHEDULES)
                           if (c.bm, c.bn, c.schedule, c.swap_ab, c.mcast) == (*key, False, 1)), None) for g in live}
            if gq is None or not all(dq.values()):
                continue
            name = f"{bm}x{bn} {sched}"
            if f"grouped {name}" not in runs and name != tag(gp):
                runs[f"grouped {name}"] = lambda i, p=gq: grouped.run(a, b, offs, out=out, plan=p)
                plans[f"grouped {name}"] = repr(gq)
            if f"dense loop {name}" not in runs:
                runs[f"dense loop {name}"] = loop(lambda x, w, o, p: engine.gemm(x, w, o, plan=p), dq)
                plans[f"dense loop {name}"] = repr(dq[live[0]])
        if os.environ.get("PROBE_SPLIT") and gp.bm == 128:
            # Two launches: the grouped pick over each group's rows but a last tile of 64 rows or fewer, and
            # 64 x 256 ping-pong over those last rows. The parts' rows packed apart beforehand (copies not
            # timed), each part's output in its own buffer: the compute a split launch would do.
            tail = [r % 128 if 0 < r % 128 <= 64 else 0 for r in sizes]
            head = [r - t for r, t in zip(sizes, tail)]
            idx0 = [i for g in live for i in range(starts[g], starts[g] + head[g])]
            idx1 = [i for g in live for i in range(starts[g] + head[g], starts[g + 1])]
            a0, a1 = a[torch.tensor(idx0, device="cuda")], a[torch.tensor(idx1, device="cuda")]
            o0 = torch.empty(len(idx0), N, device="cuda", dtype=torch.bfloat16)
            o1 = torch.empty(max(1, len(idx1)), N, device="cuda", dtype=torch.bfloat16)
            offs0 = torch.tensor([sum(head[:g]) for g in range(G + 1)], device="cuda", dtype=torch.int32)
            offs1 = torch.tensor([sum(tail[:g]) for g in range(G + 1)], device="cuda", dtype=torch.int32)
            p0 = dataclasses.replace(gp, rows=len(idx0))
            p1 = next((c for c in grouped.candidates("contiguous", G, max(1, len(idx1)), N, K)
                       if (c.bm, c.bn, c.schedule) == (64, 256, "pingpong")), None)

            def split(i, p0=p0, p1=p1):
                grouped.run(a0, b, offs0, out=o0, plan=p0)
                if idx1:
                    grouped.run(a1, b, offs1, out=o1, plan=p1)
                out[torch.tensor(idx0, device="cuda")] = o0
                if idx1:
                    out[torch.tensor(idx1, device="cuda")] = o1[: len(idx1)]
                return out

            def split_timed(i, p0=p0, p1=p1):  # the two launches only
                grouped.run(a0, b, offs0, out=o0, plan=p0)
                if idx1:
                    grouped.run(a1, b, offs1, out=o1, plan=p1)
            if p1 is not None:
                out.fill_(float("nan"))
                split(0)
                torch.cuda.synchronize()
                rows_ = ~torch.isnan(ref[:, 0])
                errors["split 128 / 64 x 256 pp (check)"] = rel_error(out[rows_].double(), ref[rows_])
                if errors["split 128 / 64 x 256 pp (check)"] <= 1e-2:
                    runs["split 128 / 64 x 256 pp"] = split_timed
                plans["split"] = f"head {head} with {tag(p0)}, tail {tail} with 64x256 pingpong"
        rows = ~torch.isnan(ref[:, 0])
        for name, fn in list(runs.items()):
            if name.startswith("split"):  # checked above (its launches write the parts' own buffers)
                continue
            out.fill_(float("nan"))
            fn(0)
            torch.cuda.synchronize()
            errors[name] = rel_error(out[rows].double(), ref[rows])
            if not errors[name] <= 1e-2:
                runs.pop(name)
        res = time_interleaved(runs, 1, rounds=9, replay_ms=20.0)
        base = res.timings["torch loop"].median_ms
        ratios = {k: round(base / t.median_ms, 4) for k, t in res.timings.items()}
        flop = 2.0 * T * N * K
        print(f"G={G} T={T} N={N} K={K} sizes {sizes} ({res.clocks.sm_mhz} MHz): " + ", ".join(
            f"{k} {flop / res.timings[k].median_ms / 1e9:.0f} TFLOP/s ({v:.3f})" for k, v in ratios.items()),
            flush=True)
        with open(out_path, "a") as f:
            f.write(json.dumps({"suite": "grouped-vs-dense", "groups": G, "T": T, "N": N, "K": K, "sizes": sizes,
                                "torch_loop_ms": base, "ratios": ratios, "errors": errors, "plans": plans,
                                "dense_picks": {g: repr(p) for g, p in dps.items()},
                                "clocks_mhz": {k: c.sm_mhz for k, c in res.clocks_by_name.items()},
                                "sm_clock_mhz": res.clocks.sm_mhz, "gpu": info.name,
                                "git_sha": os.environ.get("GEMMLAB_GIT_SHA") or git_sha()}) + "\n")


if __name__ == "__main__":
    main()
