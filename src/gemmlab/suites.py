"""Benchmark suites: which (ladder, shape, steps) jobs ``gemmlab bench`` times.

A job is one call of ``gemmlab.bench.bench_shape``: every step in it is timed interleaved with cuBLAS
on one shape in one process. Suites read the steps from the registry, so new steps join automatically.

- ``ladder``: every step of both ladders at 4096^3 (a step may ask for another shape with
  ``KernelSpec.extra["bench_shape"] = (M, N, K)``, e.g. a slow early step).
- ``square``: square sizes for the chosen steps (default: the last step of each ladder).
- ``explicit``: one shape and the named steps (``--shape M,N,K --kernel STEP``).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import registry

LADDER_SHAPE = (4096, 4096, 4096)
SQUARE_SIZES = (1024, 2048, 4096, 6144, 8192)


@dataclass
class Job:
    ladder: str
    shape: tuple[int, int, int]
    steps: list  # [(KernelSpec, config dict or None)]

    def describe(self) -> str:
        names = ", ".join(s.short.split("_")[0] for s, _ in self.steps)
        return f"{self.ladder} {'x'.join(map(str, self.shape))}: {names}"


def _group(items: list[tuple[str, tuple[int, int, int], object, dict | None]]) -> list[Job]:
    jobs: dict[tuple[str, tuple[int, int, int]], Job] = {}
    for lad, shape, spec, cfg in items:
        jobs.setdefault((lad, shape), Job(lad, shape, [])).steps.append((spec, cfg))
    return list(jobs.values())


def ladder_suite(shape: tuple[int, int, int] = LADDER_SHAPE, ladders: list[str] | None = None,
                 exclude: set[str] | None = None) -> list[Job]:
    """Every registered step of each ladder at ``shape`` (or its own ``extra["bench_shape"]``)."""
    items = []
    for spec in registry.all_kernels():
        if (ladders and spec.ladder not in ladders) or (exclude and spec.name in exclude):
            continue
        s = tuple(spec.extra.get("bench_shape", shape))
        if spec.why_unsupported(*s) is None:
            items.append((spec.ladder, s, spec, None))
    return _group(items)


def square_suite(sizes=SQUARE_SIZES, kernels: list[str] | None = None, config: dict | None = None) -> list[Job]:
    """Square problems for ``kernels`` (default: the last step of each ladder)."""
    if kernels:
        specs = [registry.get(k) for k in kernels]
    else:
        specs = [registry.all_kernels(lad)[-1] for lad in registry.ladders() if registry.all_kernels(lad)]
    items = []
    for n in sizes:
        for spec in specs:
            cfg = config if kernels else None
            if spec.why_unsupported(n, n, n, cfg) is None:
                items.append((spec.ladder, (n, n, n), spec, cfg))
    return _group(items)


def explicit(shape: tuple[int, int, int], kernels: list[str] | None, config: dict | None = None) -> list[Job]:
    """``shape`` for the named steps (default: every step that supports it). Raises on an unsupported step."""
    from .errors import UnsupportedProblem

    specs = [registry.get(k) for k in kernels] if kernels else registry.all_kernels()
    items = []
    for spec in specs:
        cfg = config if kernels else None
        why = spec.why_unsupported(*shape, cfg)
        if why:
            if kernels:
                raise UnsupportedProblem(f"{spec.name} cannot run {'x'.join(map(str, shape))}: {why}")
            continue
        items.append((spec.ladder, tuple(shape), spec, cfg))
    return _group(items)


SUITES = {"ladder": ladder_suite, "square": square_suite}
