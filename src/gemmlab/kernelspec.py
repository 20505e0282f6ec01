"""What a kernel is, as the tools and the runtime both need it: ``KernelSpec`` and its ``Param``s.

A ``KernelSpec`` states one kernel's facts (source, template, parameters and their valid values, the
problems it supports, its launch, its SASS promises) and compiles and launches it. The ladders' steps are
specs that ``gemmlab.registry`` holds; the fp32 route of ``gemmlab.matmul`` (``gemmlab.fp32``) runs one of
them without importing the registry, so the spec lives here, apart from the registry that lists them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable

from .errors import UnsupportedProblem
from .sass import SassExpect

# The operands' element type on each ladder (``registry.register_ladder`` checks its ``Ladder.dtype``).
LADDER_DTYPES = {"sgemm": "fp32", "hopper": "bf16"}


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
        return LADDER_DTYPES[self.ladder]

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
        M, K = a.shape
        N = c.shape[1]
        why = self.supports(cfg, M, N, K)
        if why:
            raise UnsupportedProblem(f"{self.name} cannot run M={M} N={N} K={K}: {why}")
        _check_operands(self, a, b, c)
        self.launcher(self, self.compile(cfg), cfg, a, b, c, alpha, beta)


def _check_operands(spec: KernelSpec, a, b, c) -> None:
    import torch

    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[spec.dtype]
    for nm, t in (("a", a), ("b", b), ("c", c)):
        if not t.is_cuda:
            raise UnsupportedProblem(f"{spec.name}: {nm} must be a CUDA tensor, got {t.device}")
        if t.dtype != dt:
            raise UnsupportedProblem(f"{spec.name}: {nm} must be {dt}, got {t.dtype}")
        if t.dim() != 2 or not t.is_contiguous():
            raise UnsupportedProblem(f"{spec.name}: {nm} must be a contiguous 2-D tensor")
    if len({a.device, b.device, c.device}) != 1:
        raise UnsupportedProblem(f"{spec.name}: a, b, c must be on one device")
