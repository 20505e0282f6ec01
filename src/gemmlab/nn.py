"""gemmlab in models: ``gemmlab.nn.Linear``, ``gemmlab.patch(model)`` / ``gemmlab.unpatch(model)``, and the
fallback to torch where gemmlab cannot run.

``Linear`` is a ``torch.nn.Linear`` (a subclass: same constructor, parameters, ``reset_parameters``,
``state_dict``, ``isinstance`` checks) whose forward is ``gemmlab.linear`` (forward and backward on gemmlab's
kernels, ``gemmlab.autograd``), with an optional fused ``activation``. ``patch`` turns a model's
``nn.Linear`` modules into this class in place, so every Parameter, hook and reference to the module stays
what it was (optimizers, tied weights, ``state_dict`` keys); ``unpatch`` turns them back.

Fallback: where gemmlab cannot run (tensors not on a CUDA GPU, a dtype other than bfloat16/float16/float32,
bfloat16/float16 on a GPU the Hopper engine does not run on), ``Linear`` computes with
``torch.nn.functional.linear`` and warns once per reason (``gemmlab.FallbackWarning``). The decision is
made once per (input dtype, input device, weight dtype) and kept, so a forward costs a dictionary lookup,
not a try/except around every call. The functional API raises its errors unless asked:
``gemmlab.linear(..., fallback=True)`` and ``gemmlab.matmul(..., fallback=True)`` take the same decision.

Autocast: under ``torch.autocast`` a ``Linear`` computes in the autocast dtype, as ``nn.Linear`` does (the
input, weight and bias are cast first; the functional API does not look at autocast).
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
def _route(dtype: torch.dtype, device: torch.device, weight_dtype: torch.dtype, who: str, stacklevel: int) -> bool:
    """Whether gemmlab runs calls on ``dtype`` inputs on ``device`` (True) or torch does (False): decided
    once per (dtype, device, weight dtype) and kept in _ROUTES; warns the first time a reason is seen."""
    key = (dtype, device, weight_dtype)
    route = _ROUTES.get(key)
    if route is None:
        why = fallback_reason(dtype, device)
        if why is not None and why not in _WARNED:
            _WARNED.add(why)
            warnings.warn(f"{who} falls back to torch: {why}. (Warned once per reason.)", FallbackWarning,
                          stacklevel=stacklevel)  # pointing at the caller's line
        route = _ROUTES[key] = why is None
    return route


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


def linear_or_fallback(x, weight, bias=None, activation=None):
    """``gemmlab.linear(..., fallback=True)``: gemmlab where it can run, else ``torch_linear``."""
    if isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor):
        if not _route(x.dtype, x.device, weight.dtype, "gemmlab.linear", 4):
            return torch_linear(x, weight, bias, activation)
    return ops.linear(x, weight, bias, activation)


def matmul_or_fallback(a, b, **kwargs):
    """``gemmlab.matmul(..., fallback=True)``: gemmlab where it can run, else ``torch_matmul`` (``out``
    written with ``copy_``)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if not _route(a.dtype, a.device, b.dtype, "gemmlab.matmul", 4):
            out = kwargs.pop("out", None)
            y = torch_matmul(a, b, **kwargs)
            return y if out is None else out.copy_(y)
    return ops.matmul(a, b, **kwargs)


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` computed by ``gemmlab.linear``: ``y = act(x @ weight.T + bias)``.

    Args as ``torch.nn.Linear`` (``in_features``, ``out_features``, ``bias``, ``device``, ``dtype``), plus
    ``activation``: None, "relu", "gelu", "gelu_tanh" or "silu", fused into the GEMM's epilogue.
    x: (..., in_features); returns (..., out_features) in x's dtype. Gradients of x, weight and bias run
    on gemmlab's kernels. Falls back to torch (one ``FallbackWarning`` per reason) where gemmlab cannot
    run: see ``gemmlab.nn``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 activation: str | None = None):
        _check_activation(activation)
        super().__init__(in_features, out_features, bias, device, dtype)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.weight, self.bias
        if torch._C._is_any_autocast_enabled():
            x, w, b = _autocast(x, w, b)
        if _route(x.dtype, x.device, w.dtype, "gemmlab.nn.Linear", 5):
            return ops.linear(x, w, b, self.activation)
        return torch_linear(x, w, b, self.activation)

    def _get_name(self) -> str:
        return "gemmlab.nn.Linear"  # printed models show which modules gemmlab computes

    def extra_repr(self) -> str:
        s = super().extra_repr()
        return s if self.activation is None else f"{s}, activation={self.activation!r}"


def _check_activation(activation) -> None:
    if activation not in _ACTIVATIONS:
        raise ValueError(f"gemmlab.nn.Linear: unknown activation {activation!r}; choose one of "
                         f"{', '.join(a for a in _ACTIVATIONS if a)} or None")


def _autocast(x, w, b):
    """The tensors as ``nn.Linear`` sees them under autocast: in the autocast dtype of x's device type."""
    dev = x.device.type
    if not torch.is_autocast_enabled(dev):
        return x, w, b
    dtype = torch.get_autocast_dtype(dev)
    return x.to(dtype), w.to(dtype), None if b is None else b.to(dtype)


# patch / unpatch --------------------------------------------------------------------------------------------

class Patch:
    """What ``patch`` did: ``modules``, the names of the modules now computed by gemmlab; ``skipped``,
    (name, class name) of the ``nn.Linear`` subclasses left alone (their forward may differ from
    ``nn.Linear``'s). ``undo()`` (or leaving a ``with patch(model):`` block) turns them back."""

    def __init__(self, model: torch.nn.Module, modules: list[str], skipped: list[tuple[str, str]]):
        self.model, self.modules, self.skipped = model, modules, skipped

    def undo(self) -> int:
        return unpatch(self.model)

    def __enter__(self) -> Patch:
        return self

    def __exit__(self, *exc) -> None:
        self.undo()

    def __repr__(self) -> str:
        return f"Patch({len(self.modules)} modules patched, {len(self.skipped)} skipped)"


def patch(model: torch.nn.Module) -> Patch:
    """Compute every ``torch.nn.Linear`` of ``model`` (``model`` itself included) with gemmlab, in place.

    Each module of exactly the class ``torch.nn.Linear`` becomes a ``gemmlab.nn.Linear`` (its class is
    changed; nothing is copied or re-created): the same Parameter objects (optimizers and tied weights
    keep working), hooks, ``state_dict`` keys and values. Subclasses of ``nn.Linear`` (whose forward may
    do more) are skipped and listed. Returns a ``Patch``; ``unpatch(model)`` or ``Patch.undo()`` reverts.
    """
    modules, skipped = [], []
    for name, m in model.named_modules():
        if type(m) is torch.nn.Linear:
            m.__class__ = Linear
            m.activation = None
            m._gemmlab_patched = True
            modules.append(name)
        elif isinstance(m, torch.nn.Linear) and type(m) is not Linear:
            skipped.append((name, type(m).__qualname__))
    return Patch(model, modules, skipped)


def unpatch(model: torch.nn.Module) -> int:
    """Turn the modules ``patch`` changed back into ``torch.nn.Linear``; returns how many. Modules created
    as ``gemmlab.nn.Linear`` stay what they are."""
    n = 0
    for m in model.modules():
        if type(m) is Linear and m.__dict__.get("_gemmlab_patched"):
            del m.activation, m._gemmlab_patched
            m.__class__ = torch.nn.Linear
            n += 1
    return n
