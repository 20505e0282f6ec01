"""gemmlab: state-of-the-art matmul kernels for NVIDIA GPUs, compiled at run time, launched on torch tensors.

    import gemmlab
    gemmlab.matmul(a, b, bias=bias, activation="gelu")   # the GEMM to call: any shape, layout, epilogue
    gemmlab.linear(x, w, b)                              # nn.Linear's layout
    gemmlab.scaled_mm(a8, w8.t(), sa, sb)                # FP8 e4m3 with per-tensor or 1x128 / 128x128 scales
    gemmlab.grouped_mm(x, w, offsets)                    # MoE experts in one launch: x (T, K), w (G, N, K)
    gemmlab.plan(4096, 4096, 4096)                       # what matmul would run: kernel and plan (no GPU needed)
    gemmlab.kernels()                                    # the registered ladder steps
    gemmlab.kernel("h01").run(a, b, c)                   # one step on torch tensors

See the README for the ladders, the tools (``gemmlab --help``) and the benchmark records.
``GEMMLAB_LOG=debug`` logs which kernel and plan each call runs (``gemmlab.log``).
"""

from . import log as _log
from .errors import (CompileError, GemmlabError, LaunchError, NoGPUError, ToolchainError,  # noqa: F401
                     UnsupportedProblem)

__version__ = "0.1.0"

_log.configure_from_env()

# Loaded on first use, so `import gemmlab` (and `gemmlab --help`) stays light: `matmul`/`linear` bring in
# torch and register the custom op, the registry brings in the ladders.
# (module, attribute): the attribute of that module; attribute None: the module itself.
_LAZY = {"matmul": ("functional", "matmul"), "linear": ("functional", "linear"), "plan": ("functional", "plan"),
         "kernels": ("registry", "all_kernels"), "kernel": ("registry", "get"),
         "nn": ("nn", None), "patch": ("nn", "patch"), "unpatch": ("nn", "unpatch"), "warmup": ("warm", "warmup"),
         "FallbackWarning": ("errors", "FallbackWarning"), "scaled_mm": ("fp8", "scaled_mm"),
         "grouped_mm": ("grouped", "grouped_mm")}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = importlib.import_module(f".{module}", __name__)
        value = getattr(value, attr) if attr else value
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gemmlab' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
