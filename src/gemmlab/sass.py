"""Disassemble cubins with nvdisasm and read what the compiler made.

``disassemble`` gives the SASS text of one kernel; ``parse`` turns it into ``Instruction`` records;
``summarize`` classifies them (global/shared loads and stores with their widths, FFMA, HGMMA, TMA,
barriers, branches, local-memory spills) and finds loops; ``check`` compares a summary with a
kernel's ``SassExpect`` from the registry. All of it works without a GPU.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field

from .errors import ToolchainError
from .jit.toolchain import nvdisasm_path

_LINE_RE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:\{\s*)?(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
_FUNC_RE = re.compile(r"^\s*\.text\.(\S+):", re.MULTILINE)


@dataclass(frozen=True)
class Instruction:
    address: int
    opcode: str  # with modifiers, e.g. "LDG.E.128.CONSTANT"
    operands: str
    predicate: str = ""
    labels: tuple[str, ...] = ()

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]


def disassemble(cubin: bytes, function: str | None = None) -> str:
    """nvdisasm's SASS for the cubin (only ``function``'s section when given)."""
    exe = nvdisasm_path()
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        proc = subprocess.run([exe, "-c", path], capture_output=True, text=True, timeout=120)
    finally:
        os.unlink(path)
    if proc.returncode != 0:
        raise ToolchainError(f"nvdisasm failed ({proc.returncode}): {proc.stderr.strip()}")
    return function_section(proc.stdout, function) if function else proc.stdout


def function_section(sass: str, function: str) -> str:
    """The part of nvdisasm's output that belongs to ``function`` (its ``.text.<name>`` section)."""
    heads = list(_FUNC_RE.finditer(sass))
    for i, m in enumerate(heads):
        if m.group(1) == function:
            end = heads[i + 1].start() if i + 1 < len(heads) else len(sass)
            return sass[m.start():end]
    raise ToolchainError(f"function {function} not found in the disassembly")


_LABEL_RE = re.compile(r"^\s*(\.L_x_\d+):")


def parse(sass: str) -> list[Instruction]:
    """Instructions in address order; ``labels`` holds the branch labels that precede each one."""
    out = []
    pending: list[str] = []
    for line in sass.splitlines():
        lm = _LABEL_RE.match(line)
        if lm:
            pending.append(lm.group(1))
            continue
        m = _LINE_RE.search(line)
        if m:
            out.append(Instruction(address=int(m.group(1), 16), predicate=(m.group(2) or "").strip(),
                                   opcode=m.group(3), operands=m.group(4).strip(), labels=tuple(pending)))
            pending = []
    return out


# Classification ----------------------------------------------------------------------------------

def _width(opcode: str) -> int:
    """Access width in bits from the opcode modifiers (32 when none is written)."""
    for w in ("128", "64", "U16", "S16", "16", "U8", "S8"):
        if f".{w}" in opcode:
            return {"U16": 16, "S16": 16, "U8": 8, "S8": 8}.get(w, int(w) if w.isdigit() else 32)
    return 32


CLASSES = {
    "global_load": ("LDG",),
    "global_store": ("STG",),
    "shared_load": ("LDS", "LDSM"),
    "shared_store": ("STS", "STSM"),
    "local": ("LDL", "STL"),
    "ffma": ("FFMA",),
    "hgmma": ("HGMMA",),
    "hmma": ("HMMA",),
    "tma": ("UTMALDG", "UTMASTG", "UTMAPF", "UBLKCP"),
    "barrier": ("BAR", "BSYNC", "BSSY", "WARPSYNC", "SYNCS", "MEMBAR", "FENCE", "DEPBAR"),
    "branch": ("BRA", "BRX", "JMP", "CALL", "RET", "EXIT"),
}


def classify(ins: Instruction) -> str:
    for cls, bases in CLASSES.items():
        if ins.base in bases:
            return cls
    return "other"


@dataclass(frozen=True)
class Loop:
    start: int
    end: int
    instructions: int
    mix: dict


@dataclass
class SassSummary:
    instructions: list[Instruction]
    opcode_counts: Counter = field(default_factory=Counter)
    class_counts: Counter = field(default_factory=Counter)
    widths: dict = field(default_factory=dict)  # class -> Counter of widths in bits
    loops: list[Loop] = field(default_factory=list)

    def has(self, pattern: str) -> bool:
        """True if any opcode matches the regex ``pattern`` (searched, e.g. ``r"LDG\\.E\\.128"``)."""
        rx = re.compile(pattern)
        return any(rx.search(op) for op in self.opcode_counts)

    def count(self, pattern: str) -> int:
        rx = re.compile(pattern)
        return sum(n for op, n in self.opcode_counts.items() if rx.search(op))


def summarize(instructions: list[Instruction]) -> SassSummary:
    s = SassSummary(instructions=instructions)
    for ins in instructions:
        s.opcode_counts[ins.opcode] += 1
        cls = classify(ins)
        s.class_counts[cls] += 1
        if cls in ("global_load", "global_store", "shared_load", "shared_store", "local"):
            s.widths.setdefault(cls, Counter())[_width(ins.opcode)] += 1
    s.loops = find_loops(instructions)
    return s


def find_loops(instructions: list[Instruction]) -> list[Loop]:
    """Loops as backward branches: a ``BRA`` whose target lies at or before it."""
    by_label = {lab: i for i, ins in enumerate(instructions) for lab in ins.labels}
    loops = []
    for i, ins in enumerate(instructions):
        if ins.base != "BRA":
            continue
        m = re.search(r"(\.L_x_\d+)", ins.operands)
        start = by_label.get(m.group(1)) if m else None
        if start is not None and start <= i:
            body = instructions[start:i + 1]
            mix = Counter(classify(b) for b in body)
            loops.append(Loop(start=instructions[start].address, end=ins.address, instructions=len(body),
                              mix=dict(mix)))
    return loops


# Expectations ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SassExpect:
    """What a kernel's SASS must show. Each field is one claim the CI checks.

    ``contains``/``absent``: opcode regexes that must / must not appear (e.g. ``r"^HGMMA"``, ``r"^LDL"``).
    ``min_loop_ffma``: some loop body holds at least this many FFMA (the inner loop was unrolled).
    ``max_registers``: per-thread register ceiling from ptxas.
    """

    contains: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    min_loop_ffma: int = 0
    max_registers: int | None = None
    no_local_memory: bool = False

    def describe(self) -> list[str]:
        out = [f"contains {p}" for p in self.contains] + [f"lacks {p}" for p in self.absent]
        if self.min_loop_ffma:
            out.append(f"a loop with >= {self.min_loop_ffma} FFMA (unrolled)")
        if self.max_registers:
            out.append(f"<= {self.max_registers} registers")
        if self.no_local_memory:
            out.append("no local memory (no LDL/STL, no stack)")
        return out


def check(expect: SassExpect, summary: SassSummary, resources=None) -> list[str]:
    """The list of failed claims (empty when the SASS meets every expectation)."""
    fails = []
    for p in expect.contains:
        if not summary.has(p):
            fails.append(f"expected an instruction matching {p!r}")
    for p in expect.absent:
        if summary.has(p):
            fails.append(f"found {summary.count(p)} instruction(s) matching {p!r}")
    if expect.min_loop_ffma:
        best = max((lp.mix.get("ffma", 0) for lp in summary.loops), default=0)
        if best < expect.min_loop_ffma:
            fails.append(f"largest loop holds {best} FFMA, expected >= {expect.min_loop_ffma}")
    if expect.no_local_memory:
        if summary.class_counts.get("local", 0):
            fails.append(f"{summary.class_counts['local']} local-memory instructions (LDL/STL)")
        if resources is not None and (resources.stack_frame or resources.spills):
            fails.append(f"stack frame {resources.stack_frame} B, spills "
                         f"{resources.spill_stores}/{resources.spill_loads} B")
    if expect.max_registers is not None and resources is not None and resources.registers > expect.max_registers:
        fails.append(f"{resources.registers} registers > {expect.max_registers}")
    return fails


def kernel_summary(compiled) -> SassSummary:
    """Summary of a ``CompiledKernel``'s own function."""
    return summarize(parse(disassemble(compiled.cubin, compiled.mangled_name)))
