"""Probe: what runs before a timed replay, and how much it moves the time.

The broad set's lean records time the model's pick twice, as a plan ("model", right after torch.mm in the
rotating order) and routed ("engine", the same plan and launch, later in the order). Over the records the two
differ systematically: where the pick loads its weight evict-first and its twin without the hint ("no evict")
is timed just before "engine", "engine" runs ~1.3% slower than "model" (H100, 164 shapes; H200 0.8%, 91); where
nothing sits between them, "engine" runs 0.8% faster (1,497 shapes). Identical kernels should not differ.

Here one plan is listed three times and its evict twin twice (torch, P1, P2, T1, P3, T2: P1 follows torch.mm,
P2 itself, P3 the twin), timed by ``time_interleaved`` three ways: as the suites time (each replay follows the
previous candidate's), with a lead-in (each replay follows one of its own), and after a flush (a 2x-L2
write before each replay). A protocol without a place effect times P1, P2 and P3 alike. One line per shape and
protocol to argv[1].

    PYTHONPATH=src:benchmarks python3 benchmarks/probes/probe_place.py OUT.jsonl [PROBE_SHAPES=...]
"""
import dataclasses
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, "benchmarks")
from gemmlab import engine, engine2, planner  # noqa: E402
from gemmlab.gpu import gpu_info  # noqa: E402
from gemmlab.timer import sets_for, time_interleaved  # noqa: E402
from plans_vs_torch import plan_tag, shapes_from_env  # noqa: E402

SHAPES = [(64, 4096, 3584), (32, 24576, 1536), (77, 5120, 5120), (32, 4096, 4096), (77, 32000, 4096),
          (64, 3072, 3072), (256, 1536, 7168), (200, 1024, 2048), (1024, 768, 3072), (2048, 16384, 4096)]
SHAPES = shapes_from_env(SHAPES)
PROTOCOLS = {"follows previous": {"flush_bytes": 0}, "lead-in": {"lead_in": True, "flush_bytes": 0}, "flush": {}}
ROUNDS = int(os.environ.get("PLACE_ROUNDS", "7"))


def main():
    info = gpu_info()
    prof = engine2._profile(torch.device("cuda"))
    with open(sys.argv[1], "a") as f:
        for M, N, K in SHAPES:
            p = planner.candidates(M, N, K, profile=prof)[0]
            twin = dataclasses.replace(p, evict_weight=not p.evict_weight)
            n = max(2, min(sets_for(2 * (M * K + N * K + M * N), info.l2_bytes), 16))
            sets = [(torch.randn(M, K, device="cuda").bfloat16(), torch.randn(N, K, device="cuda").bfloat16().t(),
                     torch.empty(M, N, device="cuda", dtype=torch.bfloat16)) for _ in range(n)]
            cands = {"torch": lambda i: torch.mm(sets[i][0], sets[i][1], out=sets[i][2])}
            for name, pl in (("P1", p), ("P2", p), ("T1", twin), ("P3", p), ("T2", twin)):
                cands[name] = lambda i, pl=pl: engine.gemm(*sets[i], plan=pl)
            for proto, kw in PROTOCOLS.items():
                res = time_interleaved(cands, n, rounds=ROUNDS, replay_ms=4.0, **kw)
                base = res.timings["torch"].median_ms
                ratios = {k: round(base / t.median_ms, 4) for k, t in res.timings.items() if k != "torch"}
                clocks = {k: c.sm_mhz for k, c in res.clocks_by_name.items()}
                print(f"{M}x{N}x{K} {plan_tag(p)} evict={p.evict_weight} [{proto}] torch {base * 1e3:.1f} us: "
                      + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()), flush=True)
                f.write(json.dumps({"suite": "place-probe", "M": M, "N": N, "K": K, "plan": repr(p),
                                    "evict_weight": p.evict_weight, "protocol": proto, "torch_ms": base,
                                    "ratios": ratios, "clocks_mhz": clocks, "sm_clock_mhz": res.clocks.sm_mhz,
                                    "samples_ms": {k: t.samples_ms for k, t in res.timings.items()},
                                    "gpu": info.name, "git_sha": os.environ.get("GEMMLAB_GIT_SHA")}) + "\n")
                f.flush()


if __name__ == "__main__":
    main()
