"""The registry as a report: the ladders and their steps, with techniques, constraints, parameters and SASS
claims (``kernel_list``), and the same as Markdown tables (``ladder_markdown``)."""

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
class KernelList:
    ladders: list[LadderInfo]
    kernels: list[KernelInfo]


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
    return KernelList(ladders=[LadderInfo(name=lad.name, title=lad.title, dtype=lad.dtype, layout=lad.layout,
                                          layout_doc=lad.layout_doc, rel_tolerance=lad.rel_tolerance)
                               for n, lad in lads.items() if ladder is None or n == ladder],
                      kernels=kernels)


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
