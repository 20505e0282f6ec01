"""gemmlab: state-of-the-art matmul kernels for NVIDIA GPUs, compiled at run time, launched on torch tensors.

    import gemmlab
    gemmlab.kernels()                    # the registered ladder steps
    gemmlab.kernel("h01").run(a, b, c)   # one step on torch tensors

See the README for the ladders, the tools (``gemmlab --help``) and the benchmark records.
"""

from .errors import (CompileError, GemmlabError, LaunchError, NoGPUError, ToolchainError,  # noqa: F401
                     UnsupportedProblem)
from .registry import all_kernels as kernels  # noqa: F401
from .registry import get as kernel  # noqa: F401

__version__ = "0.1.0"
