"""Where gemmlab cannot run, torch computes instead, if the caller asks: the decision and the torch ops.

``gemmlab.nn.Linear`` always takes this route where it must; ``gemmlab.matmul`` and ``gemmlab.linear``
only with ``fallback=True`` (else they raise their errors). The decision (``fallback_reason``: the device
type, the dtype, and for bfloat16/float16 whether the Hopper engine runs on that GPU) is made once per
(input dtype, input device, weight dtype) and kept, with one ``gemmlab.FallbackWarning`` per reason.
"""

from __future__ import annotations

import functools
import warnings

import torch

from . import ops
from .errors import FallbackWarning, GemmlabError

F = torch.nn.functional

_ACTIVATIONS = {None: None, "relu": F.relu, "gelu": F.gelu, "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
                "silu": F.silu}

# Decisions by (input dtype, input device, weight dtype): True (gemmlab) or False (torch). Kept for the
# process: whether gemmlab can run there does not change (tests that fake the engine clear them).
_ROUTES: dict[tuple, bool] = {}
_WARNED: set[str] = set()


def fallback_reason(dtype: torch.dtype, device: torch.device) -> str | None:
    """Why gemmlab cannot compute a GEMM on ``dtype`` inputs on ``device`` here, or None when it can.

    Metadata only: the device type, the dtype, and for bfloat16/float16 whether the Hopper engine runs on
    that GPU (``gemmlab.engine.hopper_available``). Meta tensors are gemmlab's (shapes only)."""
    if dtype not in ops.INPUT_DTYPES:
        return f"gemmlab takes bfloat16, float16 and float32 inputs, not {dtype}"
    try:
        ops._check_device(device)
    except GemmlabError:
        return f"gemmlab runs on CUDA GPUs and the inputs are on {device.type}"
    if dtype != torch.float32 and device.type != "meta":
        try:
            why = ops._load_engine().hopper_available(device)
        except GemmlabError as e:
            why = str(e)
        if why:
            return f"{dtype} needs gemmlab's Hopper engine, which cannot run here ({why})"
    return None


@torch.compiler.assume_constant_result  # torch.compile calls it while tracing and keeps the answer
def route(dtype: torch.dtype, device: torch.device, weight_dtype: torch.dtype, who: str, stacklevel: int) -> bool:
    """Whether gemmlab runs calls on ``dtype`` inputs on ``device`` (True) or torch does (False): decided
    once per (dtype, device, weight dtype) and kept in _ROUTES; warns the first time a reason is seen."""
    key = (dtype, device, weight_dtype)
    decision = _ROUTES.get(key)
    if decision is None:
        why = fallback_reason(dtype, device)
        if why is not None and why not in _WARNED:
            _WARNED.add(why)
            warnings.warn(f"{who} falls back to torch: {why}. (Warned once per reason.)", FallbackWarning,
                          stacklevel=stacklevel)  # pointing at the caller's line
        decision = _ROUTES[key] = why is None
    return decision


def clear_routes() -> None:
    """Forget the decisions and the reasons warned about (the next call decides, and warns, again)."""
    _ROUTES.clear()
    _WARNED.clear()


def torch_linear(x, weight, bias=None, activation=None):
    """``act(x @ weight.T + bias)`` with torch ops: the fallback of ``Linear`` and ``gemmlab.linear``."""
    y = F.linear(x, weight, bias)
    act = _ACTIVATIONS[activation]
    return y if act is None else act(y)


def torch_matmul(a, b, *, bias=None, activation=None, alpha=1.0, beta=0.0, c=None, out_dtype=None):
    """``act(alpha * a @ b + beta * c + bias)`` with torch ops (the epilogue in fp32, or fp64 for fp64
    inputs, as gemmlab's contract): the fallback of ``gemmlab.matmul``."""
    out_dtype = out_dtype or a.dtype
    y = torch.mm(a, b)
    if alpha == 1 and c is None and bias is None and activation is None:
        return y.to(out_dtype)
    y = y.to(torch.float64 if a.dtype == torch.float64 else torch.float32)
    if alpha != 1:
        y = y * alpha
    if c is not None:
        y = y + beta * c.to(y.dtype)
    if bias is not None:
        y = y + bias.to(y.dtype)
    act = _ACTIVATIONS[activation]
    return (y if act is None else act(y)).to(out_dtype)
