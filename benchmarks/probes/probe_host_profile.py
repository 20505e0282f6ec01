"""Probe: where the host time of an eager ``gemmlab.matmul`` call goes, for calls whose operands are copied
(K or N off 8: ``pad_copy_operands`` then the GEMM) against an aligned call of similar size. On an H100
host (session 39, h100_copies_probe.jsonl) copied calls took 34-59 us of host time against torch.mm's
19-33, where aligned calls took 17-23 against 14-23. Per shape: the host time of a call (GPU kept busy, so
calls only queue) for gemmlab.matmul and torch.mm (median of three interleaved measurements), then cProfile
over ``PROBE_CALLS`` calls, its 25 costliest functions by own time and by cumulative time. Text report under argv[1]; a JSON line per shape
under argv[2].

    PYTHONPATH=src python3 benchmarks/probes/probe_host_profile.py OUT.txt OUT.jsonl"""
import cProfile
import io
import json
import os
import pstats
import sys

import torch

import gemmlab
from gemmlab.gpu import gpu_info
from gemmlab.timer import eager_host_us

SHAPES = [(64, 4096, 4096), (33, 257, 129), (1, 4097, 1025), (64, 1001, 999), (64, 1000, 1000),
          (1000, 1001, 999)]
# Fewer calls than the driver's launch queue holds (~1,000 launches; two a copied call): past it a launch
# waits for the busy GPU, and the profile shows that wait as the launches' own time (2,000 calls did).
CALLS = int(os.environ.get("PROBE_CALLS", "200"))


def main():
    gpu = gpu_info().name
    report, records = open(sys.argv[1], "a"), open(sys.argv[2], "a")
    for M, N, K in SHAPES:
        a = torch.randn(M, K, device="cuda").bfloat16()
        w = torch.randn(N, K, device="cuda").bfloat16()
        ref = a.float() @ w.float().t()
        out = gemmlab.matmul(a, w.t())
        err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        assert err < 2e-2, (M, N, K, err)
        # Three interleaved measurements of each: the host's own noise (torch.mm's moved 15-31 us between
        # shapes on the H200's host) shows as their spread.
        runs = [(eager_host_us(lambda: gemmlab.matmul(a, w.t())), eager_host_us(lambda: torch.mm(a, w.t())))
                for _ in range(3)]
        host = {"gemmlab_host_us": sorted(g for g, _ in runs)[1], "torch_host_us": sorted(t for _, t in runs)[1],
                "gemmlab_host_runs_us": [round(g, 2) for g, _ in runs],
                "torch_host_runs_us": [round(t, 2) for _, t in runs]}
        torch.cuda.synchronize()
        torch.cuda._sleep(100_000_000)  # keep the GPU busy: the calls below only queue
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(CALLS):
            gemmlab.matmul(a, w.t())
        prof.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        stats = pstats.Stats(prof, stream=text)
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(25)
        head = (f"== {M}x{N}x{K}: host {host['gemmlab_host_us']:.1f} us (torch.mm {host['torch_host_us']:.1f}); "
                f"{gemmlab.plan(M, N, K)}; rel error {err:.2e}; {gpu}")
        print(head, flush=True)
        report.write(head + "\n" + text.getvalue() + "\n")
        records.write(json.dumps({"suite": "host-profile", "M": M, "N": N, "K": K, **host, "rel_error": err,
                                  "gpu": gpu, "git_sha": os.environ.get("GEMMLAB_GIT_SHA")}) + "\n")
    report.close()
    records.close()


if __name__ == "__main__":
    main()
