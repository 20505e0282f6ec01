"""The kernel registry: the one place that lists what each ladder step is and promises.

Each step is a ``KernelSpec`` (``gemmlab.kernelspec``): its name (``sgemm.k05_blocktile_2d``,
``hopper.h04_two_consumers``), the technique it adds over the step before (one line), its source file and
template, its tunable parameters and their valid values, the problems it supports, and its SASS
expectations. Tests, the CLI, the benchmark and the MCP server all read these facts from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .kernelspec import LADDER_DTYPES, KernelSpec


@dataclass(frozen=True)
class Ladder:
    """What the steps of one ladder share: dtypes, layout, inputs, reference, tolerance, baseline."""

    name: str
    title: str
    dtype: str
    layout: str
    layout_doc: str
    make_inputs: Callable  # (M, N, K, device, generator) -> (a, b, c)
    reference: Callable  # (a, b, c, alpha, beta) -> float64 tensor
    baseline: Callable  # (a, b) -> tensor: the cuBLAS call this ladder is measured against
    rel_tolerance: float


LADDERS: dict[str, Ladder] = {}
KERNELS: dict[str, KernelSpec] = {}


def register_ladder(ladder: Ladder) -> Ladder:
    if LADDER_DTYPES.get(ladder.name) != ladder.dtype:
        raise ValueError(f"ladder {ladder.name}: its dtype {ladder.dtype!r} must be kernelspec.LADDER_DTYPES's "
                         f"({LADDER_DTYPES.get(ladder.name)!r}), what its steps check operands against")
    LADDERS[ladder.name] = ladder
    return ladder


def register(spec: KernelSpec) -> KernelSpec:
    if spec.name in KERNELS:
        raise ValueError(f"kernel {spec.name} registered twice")
    if spec.ladder not in LADDERS:
        raise ValueError(f"{spec.name}: unknown ladder {spec.ladder}")
    KERNELS[spec.name] = spec
    return spec


# The modules that register the ladders' steps when imported. The registry loads them by name, as a plugin
# host does: they import the registry to register, the registry never imports their code.
LADDER_MODULES = ("gemmlab.ladders.sgemm", "gemmlab.ladders.hopper")


def _load() -> None:
    import importlib

    for name in LADDER_MODULES:
        importlib.import_module(name)


def all_kernels(ladder: str | None = None) -> list[KernelSpec]:
    _load()
    ks = [k for k in KERNELS.values() if ladder is None or k.ladder == ladder]
    return sorted(ks, key=lambda k: (k.ladder, k.step))


def get(name: str) -> KernelSpec:
    """A step by full name (``sgemm.k01_naive``) or unique short name (``k01_naive``, ``h03``)."""
    _load()
    if name in KERNELS:
        return KERNELS[name]
    matches = [k for k in KERNELS.values() if k.short == name or k.short.startswith(name + "_")
               or k.short.split("_")[0] == name]
    if len(matches) == 1:
        return matches[0]
    known = ", ".join(sorted(KERNELS))
    raise KeyError(f"no kernel named {name!r}" + (" (ambiguous)" if matches else "") + f"; known: {known}")


def ladders() -> dict[str, Ladder]:
    _load()
    return dict(LADDERS)
