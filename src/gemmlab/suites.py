"""Benchmark suites: which (ladder, shape, steps) jobs ``gemmlab bench`` times.

A job is one call of ``gemmlab.bench.bench_shape``: every (step, config) in it is timed interleaved with
cuBLAS on one shape in one process. Suites read the steps from the registry, so new steps join
automatically.

- ``ladder``: every step of both ladders at 4096^3 (a step may ask for another shape with
  ``KernelSpec.extra["bench_shape"] = (M, N, K)``, e.g. a slow early step), or at the shapes given.
- ``square``: square sizes for the chosen steps (default: the last step of each ladder).
- ``explicit``: the given shapes for the named steps (default: every step that supports a shape).

Configs, the same in every suite: a step with a shape heuristic (``KernelSpec.heuristic``) is timed with
what ``KernelSpec.config_for`` picks for the shape, as ``gemmlab.matmul`` would run it; other steps with
their defaults. ``config`` overrides parameters of that base config (for named steps). ``configs`` adds
variants to the same interleaved run: each is overlaid on the base, and is skipped for a step that lacks
one of its parameters, does not offer one of its values, or cannot run the shape with it. The base
config always comes first, so the first record of each (step, shape) is the one the step would pick.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from . import registry
from .errors import UnsupportedProblem

LADDER_SHAPE = (4096, 4096, 4096)
SQUARE_SIZES = (1024, 2048, 4096, 6144, 8192)

Shape = tuple[int, int, int]


@dataclass
class Job:
    ladder: str
    shape: Shape
    steps: list  # [(KernelSpec, config dict or None)]

    def describe(self) -> str:
        names = ", ".join(s.short.split("_")[0] + _variant(s, c) for s, c in self.steps)
        return f"{self.ladder} {'x'.join(map(str, self.shape))}: {names}"


def _variant(spec, cfg) -> str:
    diff = {k: v for k, v in spec.resolve(cfg).items() if spec.default_config()[k] != v}
    return "[" + ",".join(f"{k}={v}" for k, v in diff.items()) + "]" if diff else ""


def _group(items: Iterable[tuple[str, Shape, object, dict | None]]) -> list[Job]:
    jobs: dict[tuple[str, Shape], Job] = {}
    for lad, shape, spec, cfg in items:
        jobs.setdefault((lad, shape), Job(lad, shape, [])).steps.append((spec, cfg))
    return list(jobs.values())


def _sm_count(sm_count: int | None) -> int:
    if sm_count is not None:
        return sm_count
    from .model import device_profile

    return device_profile().sm_count  # the visible GPU's, else the H200 profile's


def _as_shapes(shapes) -> list[Shape]:
    """``4096``, ``(M, N, K)`` or a sequence of either -> a list of (M, N, K)."""
    if isinstance(shapes, int):
        return [(shapes,) * 3]
    shapes = list(shapes)
    if len(shapes) == 3 and all(isinstance(v, int) for v in shapes):
        return [tuple(shapes)]
    return [(s,) * 3 if isinstance(s, int) else tuple(int(v) for v in s) for s in shapes]


def base_config(spec, M: int, N: int, K: int, sm_count: int, config: dict | None = None) -> dict | None:
    """What ``spec`` runs at M x N x K unless told otherwise: its heuristic's choice for the shape (``None``,
    the defaults, without one), overlaid with ``config``. Raises ``UnsupportedProblem`` if ``config`` names
    a parameter or value the step does not have."""
    base = spec.config_for(M, N, K, sm_count) if spec.heuristic is not None else None
    if config:
        base = {**(base or {}), **config}
        spec.resolve(base)  # the user's config: an error, never skipped
    return base


def step_configs(spec, M: int, N: int, K: int, sm_count: int, *, config: dict | None = None,
                 configs: Sequence[dict] = ()) -> list[dict | None]:
    """The configs of ``spec`` to time at M x N x K: ``base_config`` first, then each of ``configs`` the
    step offers (overlaid on the base; duplicates dropped). Empty if the base cannot run the shape."""
    base = base_config(spec, M, N, K, sm_count, config)
    if spec.why_unsupported(M, N, K, base):
        return []
    out, seen = [base], [spec.resolve(base)]
    for extra in configs:
        if not set(extra) <= set(spec.param_names()):
            continue
        cfg = {**(base or {}), **extra}
        try:
            resolved = spec.resolve(cfg)
            if resolved in seen or spec.why_unsupported(M, N, K, cfg):
                continue
        except UnsupportedProblem:  # a value this step does not offer
            continue
        out.append(cfg)
        seen.append(resolved)
    return out


def _jobs(pairs: Iterable[tuple[object, Shape]], sm_count: int | None, config: dict | None,
          configs: Sequence[dict]) -> list[Job]:
    sms = _sm_count(sm_count)
    return _group((spec.ladder, shape, spec, cfg) for spec, shape in pairs
                  for cfg in step_configs(spec, *shape, sms, config=config, configs=configs))


def _specs(kernels: list[str] | None, ladders: list[str] | None, exclude: set[str] | None = None) -> list:
    specs = [registry.get(k) for k in kernels] if kernels else registry.all_kernels()
    return [s for s in specs if (not ladders or s.ladder in ladders) and not (exclude and s.name in exclude)]


def ladder_suite(shapes=None, ladders: list[str] | None = None, exclude: set[str] | None = None, *,
                 kernels: list[str] | None = None, config: dict | None = None, configs: Sequence[dict] = (),
                 sm_count: int | None = None) -> list[Job]:
    """Every registered step of ``ladders`` (or the named ``kernels``) at each of ``shapes`` it supports.
    Without ``shapes``: 4096^3, or a step's own ``extra["bench_shape"]``."""
    specs = _specs(kernels, ladders, exclude)
    if shapes is None:
        pairs = [(s, tuple(s.extra.get("bench_shape", LADDER_SHAPE))) for s in specs]
    else:
        pairs = [(s, shape) for shape in _as_shapes(shapes) for s in specs]
    return _jobs(pairs, sm_count, config, configs)


def square_suite(sizes=SQUARE_SIZES, kernels: list[str] | None = None, config: dict | None = None, *,
                 ladders: list[str] | None = None, configs: Sequence[dict] = (),
                 sm_count: int | None = None) -> list[Job]:
    """Square problems (or any ``(M, N, K)`` in ``sizes``) for ``kernels`` (default: the last step of each
    ladder)."""
    if kernels:
        specs = _specs(kernels, ladders)
    else:
        specs = [registry.all_kernels(lad)[-1] for lad in registry.ladders()
                 if registry.all_kernels(lad) and (not ladders or lad in ladders)]
    return _jobs([(s, shape) for shape in _as_shapes(sizes) for s in specs], sm_count, config, configs)


def explicit(shapes, kernels: list[str] | None = None, config: dict | None = None, *,
             ladders: list[str] | None = None, configs: Sequence[dict] = (),
             sm_count: int | None = None) -> list[Job]:
    """``shapes`` (one (M, N, K) or several) for the named steps (default: every step of ``ladders``),
    each at the shapes it supports. Raises ``UnsupportedProblem`` if a named step supports none of them."""
    shapes = _as_shapes(shapes)
    jobs = ladder_suite(shapes, ladders, kernels=kernels, config=config, configs=configs, sm_count=sm_count)
    timed = {spec.name for job in jobs for spec, _ in job.steps}
    for spec in _specs(kernels, ladders) if kernels else ():
        if spec.name not in timed:
            shape = shapes[0]
            why = spec.why_unsupported(*shape, base_config(spec, *shape, _sm_count(sm_count), config))
            what = "x".join(map(str, shape)) if len(shapes) == 1 else "any of the shapes"
            raise UnsupportedProblem(f"{spec.name} cannot run {what}: {why}")
    return jobs


SUITES = {"ladder": ladder_suite, "square": square_suite}
