"""Cold compile vs warm disk-cache load for one kernel of each ladder (numbers for the README).

    python benchmarks/jit_timing.py
"""

import tempfile
import time
from pathlib import Path

from gemmlab import registry
from gemmlab.jit.compiler import clear_memory_cache


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        for name in ("sgemm.k01_naive", "hopper.h01_tma_wgmma", "hopper.h10_deep_pipeline"):
            spec = registry.get(name)
            clear_memory_cache()
            t0 = time.perf_counter()
            cold = spec.compile(cache_path=Path(d))
            t1 = time.perf_counter()
            clear_memory_cache()
            warm = spec.compile(cache_path=Path(d))
            t2 = time.perf_counter()
            t3 = time.perf_counter()
            spec.compile(cache_path=Path(d))  # in-process memo
            t4 = time.perf_counter()
            assert (cold.cache_status, warm.cache_status) == ("miss", "hit")
            print(f"{name:28s} cold {1e3 * (t1 - t0):8.1f} ms   warm (disk) {1e3 * (t2 - t1):6.2f} ms   "
                  f"in-process {1e6 * (t4 - t3):6.1f} us")


if __name__ == "__main__":
    main()
