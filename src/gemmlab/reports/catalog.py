"""The registry as a report: the ladders and their steps, with techniques, constraints, parameters and SASS
claims, and the library's planned kernels (``kernel_list``); the ladders as Markdown tables
(``ladder_markdown``)."""

from __future__ import annotations

from dataclasses import dataclass

from . import BadRequest, doc


@dataclass
class ParamInfo:
    name: str
    choices: list[int]
    default: int
    doc: str
    template: bool = doc("True: a template parameter (recompiles); False: a launch-time option")


@dataclass
class KernelInfo:
    name: str = doc("full registry name, e.g. 'hopper.h04_two_consumers'")
    short: str
    ladder: str
    step: int
    technique: str = doc("what this step adds over the one before")
    arch: str
    source: str = doc("file under gemmlab/kernels")
    template: str
    constraints: str = doc("the problems (shapes, alignment) it accepts")
    params: list[ParamInfo]
    configs: int = doc("valid parameter combinations")
    sass_expectations: list[str] = doc("claims the CI checks on its SASS")
    notes: str = ""


@dataclass
class LadderInfo:
    name: str
    title: str
    dtype: str
    layout: str
    layout_doc: str
    rel_tolerance: float


@dataclass
class PlannedInfo:
    name: str = doc("'engine', 'fp8' or 'grouped': give it to inspect_plan (or `gemmlab inspect NAME --shape`)")
    runs: str = doc("the library call that runs it and the planner that picks its instantiation per shape")
    source: str = doc("file under gemmlab/kernels")


@dataclass
class KernelList:
    ladders: list[LadderInfo]
    kernels: list[KernelInfo]
    planned: list[PlannedInfo] = doc("the library's kernels, not ladder steps: one instantiation per shape, "
                                     "chosen by a plan model (inspect_plan shows the one a shape gets)")


def kernel_list(ladder: str | None = None) -> KernelList:
    """The registered ladders and steps (only ``ladder``'s when given)."""
    from .. import registry

    lads = registry.ladders()
    if ladder is not None and ladder not in lads:
        raise BadRequest(f"no ladder {ladder!r}; ladders: {sorted(lads)}")
    kernels = [KernelInfo(name=s.name, short=s.short, ladder=s.ladder, step=s.step, technique=s.technique,
                          arch=s.arch, source=s.source, template=s.template, constraints=s.constraints,
                          params=[ParamInfo(name=p.name, choices=list(p.choices), default=p.value, doc=p.doc,
                                            template=p.template) for p in s.params],
                          configs=len(s.configs()), sass_expectations=s.sass.describe(), notes=s.notes)
               for s in registry.all_kernels(ladder)]
    from .. import grouped, planner
    from .compiled import PLANNED

    sources = {"engine": planner.SOURCE, "fp8": planner.FP8_SOURCE,
               "grouped": f"{grouped.SOURCE} (few rows an expert: {grouped.FIT_SOURCE})"}
    return KernelList(ladders=[LadderInfo(name=lad.name, title=lad.title, dtype=lad.dtype, layout=lad.layout,
                                          layout_doc=lad.layout_doc, rel_tolerance=lad.rel_tolerance)
                               for n, lad in lads.items() if ladder is None or n == ladder],
                      kernels=kernels,
                      planned=[PlannedInfo(name=n, runs=what, source=sources[n]) for n, what in PLANNED.items()]
                      if ladder is None else [])


def ladder_markdown() -> str:
    """Every ladder as a Markdown table: step, name, technique, arch, parameters, constraints."""
    from .. import registry

    out = []
    for name, lad in registry.ladders().items():
        out += [f"## {name}: {lad.title}", "", f"Layout {lad.layout}: {lad.layout_doc}", "",
                "| step | name | technique | arch | parameters | constraints |", "|---|---|---|---|---|---|"]
        for s in registry.all_kernels(name):
            params = ", ".join(f"{p.name}={p.value} of {list(p.choices)}" for p in s.params) or "-"
            out.append(f"| {s.step} | `{s.name}` | {s.technique} | {s.arch} | {params} | {s.constraints} |")
        out.append("")
    return "\n".join(out)
