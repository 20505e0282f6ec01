"""Which cuBLAS kernels torch.mm runs on the pitch class and on decode shapes (torch.profiler names)."""
import torch
from torch.profiler import profile, ProfilerActivity

from plans_vs_torch import shapes_from_env

shapes = [(3000, 3000, 3000), (3072, 3072, 3072), (1000, 1000, 1000), (2050, 3000, 1000), (3000, 5000, 1000),
          (16, 14336, 4096), (8, 14336, 4096), (16, 8192, 8192), (1, 16384, 16384), (128, 4096, 4096),
          (256, 5120, 5120), (1536, 1024, 4096), (200, 4096, 4096)]
shapes = shapes_from_env(shapes)  # PROBE_SHAPES="M,N,K;..." in its place
for M, N, K in shapes:
    a = torch.randn(M, K, device="cuda").bfloat16(); w = torch.randn(N, K, device="cuda").bfloat16()
    for _ in range(3): torch.mm(a, w.t())
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        torch.mm(a, w.t()); torch.cuda.synchronize()
    names = [(e.name, e.device_time) for e in p.events() if e.device_type.name == "CUDA"]
    print(f"{M}x{N}x{K}: " + " | ".join(f"{n} ({t:.1f} us)" for n, t in names), flush=True)
