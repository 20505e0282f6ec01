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

import torch

from . import functional
# Re-exported: gemmlab.nn is where users look for the fallback's decision and switches.
from .fallback import _ACTIVATIONS, clear_routes, fallback_reason, route, torch_linear, torch_matmul  # noqa: F401

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
        else:  # shapes seen before: straight to the prepared call (it ran on gemmlab, so no fallback here)
            y = functional._linear_fast(x, w, b, self.activation)
            if y is not None:
                return y
        if route(x.dtype, x.device, w.dtype, "gemmlab.nn.Linear", 5):
            return functional.linear(x, w, b, self.activation)
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
