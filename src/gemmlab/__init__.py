"""gemmlab: state-of-the-art matmul kernels for NVIDIA GPUs, compiled at run time, launched on torch tensors.

    import gemmlab
    gemmlab.kernels()                    # the registered ladder steps
    gemmlab.kernel("h01").run(a, b, c)   # one step on torch tensors
    gemmlab.matmul(a, b, bias=bias, activation="gelu")   # the GEMM to call: any shape, layout, epilogue

See the README for the ladders, the tools (``gemmlab --help``) and the benchmark records.
"""

from .errors import (CompileError, GemmlabError, LaunchError, NoGPUError, ToolchainError,  # noqa: F401
                     UnsupportedProblem)
from .registry import all_kernels as kernels  # noqa: F401
from .registry import get as kernel  # noqa: F401

__version__ = "0.1.0"


_INTEGRATION = {"nn": ("nn", None), "patch": ("nn", "patch"), "unpatch": ("nn", "unpatch"),
                "warmup": ("warm", "warmup"), "FallbackWarning": ("errors", "FallbackWarning")}


def __getattr__(name: str):
    # gemmlab.matmul / gemmlab.linear (gemmlab.ops) load torch and register the custom op on first use,
    # so `import gemmlab` stays light for the static tools.
    if name in ("matmul", "linear"):
        from . import ops

        globals()[name] = getattr(ops, name)
        return globals()[name]
    if name in _INTEGRATION:  # gemmlab.nn.Linear, patch/unpatch, warmup (issue 17)
        import importlib

        module, attr = _INTEGRATION[name]
        value = importlib.import_module(f"{__name__}.{module}")
        globals()[name] = value = getattr(value, attr) if attr else value
        return value
    raise AttributeError(f"module 'gemmlab' has no attribute {name!r}")
