"""The exceptions gemmlab raises. Each names what failed and, where it can, what to do about it."""


class GemmlabError(RuntimeError):
    """Base class for gemmlab's own errors."""


class ToolchainError(GemmlabError):
    """A compiler, header folder or disassembler gemmlab needs is missing."""


class CompileError(GemmlabError):
    """NVRTC rejected a kernel. The message carries the kernel name and the compiler log."""


class NoGPUError(GemmlabError):
    """The operation needs an NVIDIA GPU and none is visible (or it is not the architecture needed)."""


class LaunchError(GemmlabError):
    """A CUDA call around a kernel launch failed. The message names the kernel and the call."""


class UnsupportedProblem(GemmlabError, ValueError):
    """A kernel was asked for a shape, layout, dtype or alignment it does not support."""


class FallbackWarning(UserWarning):
    """gemmlab could not run a call here and torch computed it instead (``gemmlab.nn``; warned once per reason)."""
