import sys, torch
from gemmlab import engine
from gemmlab.timer import time_interleaved
shapes = [tuple(int(x) for x in s.split(",")) for s in sys.argv[1].split(";")]
for (M, N, K, lay) in [(s[0], s[1], s[2], "NT") for s in shapes]:
    sets = []
    for i in range(4):
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        sets.append((a, w.t(), torch.empty(M, N, device="cuda", dtype=torch.bfloat16)))
    res = time_interleaved({"torch": lambda i: torch.mm(sets[i][0], sets[i][1], out=sets[i][2]),
                            "gemmlab": lambda i: engine.gemm(*sets[i])}, 4, rounds=10)
    t, b = res.timings["gemmlab"].median_ms, res.timings["torch"].median_ms
    by = 2 * (M * K + K * N + M * N)
    print(f"{M}x{N}x{K}: gemmlab {2*M*N*K/t/1e9:7.1f} TF {by/t/1e6:7.0f} GB/s | torch {2*M*N*K/b/1e9:7.1f} TF {by/b/1e6:7.0f} GB/s | ratio {b/t:.3f} | {res.clocks.sm_mhz} MHz", flush=True)
