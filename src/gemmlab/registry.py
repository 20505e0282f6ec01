"""The kernel registry: the one place that states what each ladder step is and promises.

Each step is a ``KernelSpec``: its name (``sgemm.k05_blocktile_2d``, ``hopper.h04_two_consumers``), the
technique it adds over the step before (one line), its source file and template, its tunable
parameters and their valid values, the problems it supports, and its SASS expectations. Tests, the
CLI, the benchmark and the MCP server all read these facts from here.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable

from .errors import UnsupportedProblem
from .sass import SassExpect


@dataclass(frozen=True)
class Param:
    """A template parameter and the values it may take (the first is the default unless given)."""

    name: str
    choices: tuple[int, ...]
    doc: str = ""
    default: int | None = None
    template: bool = True  # False: a launch-time option (no recompile), e.g. the tile order
    only_if: Callable | None = None  # config -> bool: the parameter matters only then (else its default)

    @property
    def value(self) -> int:
        return self.choices[0] if self.default is None else self.default


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


@dataclass(frozen=True)
class KernelSpec:
    name: str
    ladder: str
    step: int
    technique: str
    source: str  # path under gemmlab/kernels
    template: str  # the __global__ template's name
    params: tuple[Param, ...]
    arch: str
    constraints: str  # human-readable statement of what problems it accepts
    sass: SassExpect
    launcher: Callable  # (spec, compiled, config, a, b, c, alpha, beta) -> None
    supports: Callable  # (config, M, N, K) -> None or a reason string
    threads: Callable  # config -> threads per block
    smem_bytes: Callable  # config -> dynamic shared memory per block
    tile: Callable  # config -> (BM, BN, BK) block tile
    check_config: Callable | None = None  # config -> None or a reason string (cross-parameter rules)
    heuristic: Callable | None = None  # (M, N, K, sm_count) -> config overrides chosen for that shape
    template_prefix: tuple[str, ...] = ()  # fixed template arguments before the parameters (e.g. types)
    template_suffix: tuple[str, ...] = ()  # fixed template arguments after them
    # config -> every template argument, for a step whose instantiation is not its template parameters in
    # order (an argument derived from several parameters); replaces prefix, parameters and suffix.
    template_args: Callable | None = None
    # config -> SassExpect, for a step whose instantiations keep different promises (default: ``sass``)
    sass_for: Callable | None = None
    notes: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def dtype(self) -> str:
        """The element type of the step's ladder ("fp32", "bf16")."""
        return LADDERS[self.ladder].dtype

    @property
    def short(self) -> str:
        return self.name.split(".", 1)[1]

    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def default_config(self) -> dict[str, int]:
        return {p.name: p.value for p in self.params}

    def resolve(self, config: dict | None = None) -> dict[str, int]:
        """Defaults overlaid with ``config``; every value checked against its ``Param.choices``."""
        cfg = self.default_config()
        for k, v in (config or {}).items():
            p = next((p for p in self.params if p.name == k), None)
            if p is None:
                raise UnsupportedProblem(f"{self.name}: unknown parameter {k!r} (has {self.param_names()})")
            if int(v) not in p.choices:
                raise UnsupportedProblem(f"{self.name}: {k}={v} not in {p.choices}")
            cfg[k] = int(v)
        if self.check_config is not None:
            why = self.check_config(cfg)
            if why:
                raise UnsupportedProblem(f"{self.name}: config {cfg} rejected: {why}")
        return cfg

    def configs(self) -> list[dict[str, int]]:
        """Every valid combination of the parameters (the autotuner's search space)."""
        out, seen = [], set()
        for values in itertools.product(*(p.choices for p in self.params)):
            cfg = dict(zip(self.param_names(), values))
            for p in self.params:  # a parameter that does not matter here is pinned, so no config repeats
                if p.only_if is not None and not p.only_if(cfg):
                    cfg[p.name] = p.value
            key = tuple(cfg.items())
            if key in seen:
                continue
            seen.add(key)
            if self.check_config is None or not self.check_config(cfg):
                out.append(cfg)
        return out

    def name_expression(self, config: dict | None = None) -> str:
        cfg = self.resolve(config)
        if self.template_args is not None:
            targs = [str(a) for a in self.template_args(cfg)]
        else:
            targs = [*self.template_prefix, *(str(cfg[p.name]) for p in self.params if p.template),
                     *self.template_suffix]
        return f"{self.template}<{', '.join(targs)}>" if targs else self.template

    def sass_expect(self, config: dict | None = None) -> SassExpect:
        """What the SASS of ``config``'s instantiation must show (``sass`` unless the step says per config)."""
        return self.sass if self.sass_for is None else self.sass_for(self.resolve(config))

    def compile(self, config: dict | None = None, **kwargs):
        """Compile (or load from cache) this step for ``config``. Works without a GPU."""
        from .jit.compiler import compile_kernel

        return compile_kernel(self.source, self.name_expression(config), arch=self.arch,
                              name=f"{self.name}{self.config_tag(config)}", **kwargs)

    def config_tag(self, config) -> str:
        """``[K=V,...]`` for a config (empty for a step without parameters): names a compiled variant."""
        if not self.params:
            return ""
        cfg = self.resolve(config)
        return "[" + ",".join(f"{k}={v}" for k, v in cfg.items()) + "]"

    def config_for(self, M: int, N: int, K: int, sm_count: int, *, tuned: bool = True) -> dict[str, int]:
        """The config this step would pick for a shape: what ``gemmlab tune`` saved for this step and exact
        shape on the visible GPU (``gemmlab.tuned.best_config``; skipped with ``tuned=False``, without a
        GPU, or when ``sm_count`` is not the visible GPU's), else its heuristic over the defaults."""
        if tuned and self.params:
            from .tuned import best_config

            best = best_config(self, M, N, K, sm_count)
            if best is not None:
                return best
        cfg = self.default_config()
        if self.heuristic is not None:
            cfg.update(self.heuristic(M, N, K, sm_count))
        return self.resolve(cfg)

    def why_unsupported(self, M: int, N: int, K: int, config: dict | None = None) -> str | None:
        return self.supports(self.resolve(config), M, N, K)

    def run(self, a, b, c, *, alpha: float = 1.0, beta: float = 0.0, config: dict | None = None) -> None:
        """Launch this step on torch tensors (see the ladder's ``layout_doc`` for shapes)."""
        cfg = self.resolve(config)
        lad = LADDERS[self.ladder]
        M, K = a.shape
        N = c.shape[1]
        why = self.supports(cfg, M, N, K)
        if why:
            raise UnsupportedProblem(f"{self.name} cannot run M={M} N={N} K={K}: {why}")
        _check_operands(self, lad, a, b, c)
        self.launcher(self, self.compile(cfg), cfg, a, b, c, alpha, beta)


def _check_operands(spec: KernelSpec, lad: Ladder, a, b, c) -> None:
    import torch

    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[lad.dtype]
    for nm, t in (("a", a), ("b", b), ("c", c)):
        if not t.is_cuda:
            raise UnsupportedProblem(f"{spec.name}: {nm} must be a CUDA tensor, got {t.device}")
        if t.dtype != dt:
            raise UnsupportedProblem(f"{spec.name}: {nm} must be {dt}, got {t.dtype}")
        if t.dim() != 2 or not t.is_contiguous():
            raise UnsupportedProblem(f"{spec.name}: {nm} must be a contiguous 2-D tensor")
    if len({a.device, b.device, c.device}) != 1:
        raise UnsupportedProblem(f"{spec.name}: a, b, c must be on one device")


LADDERS: dict[str, Ladder] = {}
KERNELS: dict[str, KernelSpec] = {}


def register_ladder(ladder: Ladder) -> Ladder:
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
