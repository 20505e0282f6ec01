"""Disassemble cubins with nvdisasm and read what the compiler made.

``disassemble`` gives the SASS text of one kernel; ``parse`` turns it into ``Instruction`` records;
``summarize`` classifies them (global/shared loads and stores with their widths, FFMA, HGMMA, TMA,
barriers, branches, local-memory spills) and finds loops; ``check`` compares a summary with a
kernel's ``SassExpect`` from the registry. All of it works without a GPU.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ToolchainError
from .jit.toolchain import nvdisasm_path
from .log import logger, timed

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
    """nvdisasm's SASS for the cubin (only ``function``'s section when given).

    The text is cached next to the compiled cubins (``<cache folder>/sass/``, keyed by a hash of the
    cubin and of the nvdisasm binary), so an unchanged kernel is disassembled once, not on every
    ``gemmlab`` run; a folder that cannot be written only costs the cache."""
    text = _disassembly(cubin)
    return function_section(text, function) if function else text


_MEMO: dict[str, str] = {}  # the last few disassemblies of this process
_MEMO_SIZE = 64


def _disassembly(cubin: bytes) -> str:
    exe = nvdisasm_path()
    key = _cache_key(cubin, exe)
    text = _MEMO.get(key)
    if text is None:
        path = _sass_dir() / f"{key}.sass"
        try:
            text = path.read_text()
            logger.debug("SASS of cubin %s from %s", key[:12], path)
        except (OSError, UnicodeDecodeError):
            with timed("disassembled cubin %s (%d bytes)", key[:12], len(cubin)):
                text = _run_nvdisasm(exe, cubin)
            _store(path, text)
        if len(_MEMO) >= _MEMO_SIZE:
            _MEMO.pop(next(iter(_MEMO)))
        _MEMO[key] = text
    return text


def _cache_key(cubin: bytes, exe: str) -> str:
    """A hash of the cubin and of the disassembler (its path, size and date: a new nvdisasm may print
    differently)."""
    h = hashlib.sha256(cubin)
    try:
        st = os.stat(exe)
        h.update(f"\0{exe}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    except OSError:
        h.update(f"\0{exe}".encode())
    return h.hexdigest()[:40]


def _sass_dir() -> Path:
    from .jit.cache import cache_dir

    return cache_dir() / "sass"


def _store(path: Path, text: str) -> None:
    """Write atomically (a reader never sees half a file); an unwritable folder is only logged."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as e:
        logger.debug("SASS cache not written (%s): %s", path.parent, e)


def _run_nvdisasm(exe: str, cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        proc = subprocess.run([exe, "-c", path], capture_output=True, text=True, timeout=120)
    finally:
        os.unlink(path)
    if proc.returncode != 0:
        raise ToolchainError(f"nvdisasm failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


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
    start: int  # address of the loop header
    end: int  # highest address in the body
    instructions: int
    mix: dict
    addresses: frozenset = frozenset()  # every instruction address in the body


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


def _blocks(instructions: list[Instruction]):
    """Basic blocks (lists of instruction indices) and their successor blocks."""
    by_label = {lab: i for i, ins in enumerate(instructions) for lab in ins.labels}
    leaders = {0}
    for i, ins in enumerate(instructions):
        if ins.base in ("BRA", "EXIT", "RET", "BRX", "JMP"):
            leaders.add(i + 1)
            m = re.search(r"(\.L_x_\d+)", ins.operands)
            if m and m.group(1) in by_label:
                leaders.add(by_label[m.group(1)])
        if ins.labels:
            leaders.add(i)
    starts = sorted(x for x in leaders if x < len(instructions))
    blocks = [list(range(a, b)) for a, b in zip(starts, starts[1:] + [len(instructions)])]
    block_of = {blk[0]: n for n, blk in enumerate(blocks)}
    succ: list[set[int]] = []
    for n, blk in enumerate(blocks):
        last = instructions[blk[-1]]
        out = set()
        falls = n + 1 < len(blocks)
        if last.base == "BRA":
            m = re.search(r"(\.L_x_\d+)", last.operands)
            if m and m.group(1) in by_label:
                out.add(block_of[by_label[m.group(1)]])
            falls = falls and bool(last.predicate)
        elif last.base in ("EXIT", "RET", "BRX", "JMP"):
            falls = falls and bool(last.predicate)
        if falls:
            out.add(n + 1)
        succ.append(out)
    return blocks, succ


def find_loops(instructions: list[Instruction]) -> list[Loop]:
    """Natural loops of the control-flow graph: a back edge u -> h whose target h dominates u.

    Out-of-line slow paths that jump back (an mbarrier retry placed at the end of the function) make
    backward branches that are not loop bodies by address range; the CFG view gets them right.
    """
    if not instructions:
        return []
    blocks, succ = _blocks(instructions)
    n = len(blocks)
    pred: list[set[int]] = [set() for _ in range(n)]
    for u, vs in enumerate(succ):
        for v in vs:
            pred[v].add(u)
    everything = set(range(n))
    dom = [everything.copy() for _ in range(n)]
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for v in range(1, n):
            ps = [dom[p] for p in pred[v]]
            new = (set.intersection(*ps) if ps else set()) | {v}
            if new != dom[v]:
                dom[v], changed = new, True
    loops = []
    for u in range(n):
        for h in succ[u]:
            if h not in dom[u]:
                continue
            body, todo = {h, u}, ([u] if u != h else [])
            while todo:
                x = todo.pop()
                for p in pred[x]:
                    if p not in body:
                        body.add(p)
                        todo.append(p)
            idx = sorted(i for b in body for i in blocks[b])
            ins = [instructions[i] for i in idx]
            loops.append(Loop(start=instructions[blocks[h][0]].address, end=max(x.address for x in ins),
                              instructions=len(ins), mix=dict(Counter(classify(x) for x in ins)),
                              addresses=frozenset(x.address for x in ins)))
    return loops


# Expectations ------------------------------------------------------------------------------------

# Programmatic dependent launch (kernels/common/ptx.cuh): griddepcontrol.wait compiles to ACQBULK,
# griddepcontrol.launch_dependents to PREEXIT. The engine's kernels launched with ``Launcher(pdl=True)``
# must show both.
PDL_OPCODES = (r"^ACQBULK", r"^PREEXIT")

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
    loop_absent: tuple[str, ...] = ()  # opcode regexes that must not appear inside any loop body
    # opcode regexes that must not appear in the innermost loops that issue wgmma (HGMMA): the k-loops
    wgmma_loop_absent: tuple[str, ...] = ()
    # (opcode regex, operands regex) pairs that some instruction must / no instruction may match, e.g.
    # (r"^UTMALDG", r"desc\[") for a TMA load with an L2 cache policy
    contains_operands: tuple[tuple[str, str], ...] = ()
    absent_operands: tuple[tuple[str, str], ...] = ()

    def describe(self) -> list[str]:
        out = [f"contains {p}" for p in self.contains] + [f"lacks {p}" for p in self.absent]
        if self.min_loop_ffma:
            out.append(f"a loop with >= {self.min_loop_ffma} FFMA (unrolled)")
        if self.max_registers:
            out.append(f"<= {self.max_registers} registers")
        if self.no_local_memory:
            out.append("no local memory (no LDL/STL, no stack)")
        out += [f"no {p} inside a loop" for p in self.loop_absent]
        out += [f"no {p} in the wgmma k-loop" for p in self.wgmma_loop_absent]
        out += [f"contains {o} with operands {a}" for o, a in self.contains_operands]
        out += [f"no {o} with operands {a}" for o, a in self.absent_operands]
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
    for p in expect.loop_absent:
        rx = re.compile(p)
        hits = {ins.opcode for lp in summary.loops for ins in summary.instructions
                if ins.address in lp.addresses and rx.search(ins.opcode)}
        if hits:
            fails.append(f"{', '.join(sorted(hits))} inside a loop (matches {p!r})")
    if expect.wgmma_loop_absent:
        for lp in wgmma_loops(summary):
            for p in expect.wgmma_loop_absent:
                rx = re.compile(p)
                n = sum(1 for ins in summary.instructions if ins.address in lp.addresses and rx.search(ins.opcode))
                if n:
                    fails.append(f"{n} instruction(s) matching {p!r} in the wgmma k-loop at {lp.start:#x}")
    for (o, a), want in [(pair, True) for pair in expect.contains_operands] + [
            (pair, False) for pair in expect.absent_operands]:
        ro, ra = re.compile(o), re.compile(a)
        n = sum(1 for ins in summary.instructions if ro.search(ins.opcode) and ra.search(ins.operands))
        if want and not n:
            fails.append(f"expected an instruction matching {o!r} with operands matching {a!r}")
        elif n and not want:
            fails.append(f"found {n} instruction(s) matching {o!r} with operands matching {a!r}")
    if expect.max_registers is not None and resources is not None and resources.registers > expect.max_registers:
        fails.append(f"{resources.registers} registers > {expect.max_registers}")
    return fails


def wgmma_loops(summary: SassSummary) -> list[Loop]:
    """The innermost loops that issue wgmma (HGMMA / QGMMA): loops holding one, none of whose inner loops
    (a loop whose instructions it contains) holds one too."""
    mma = {ins.address for ins in summary.instructions if ins.base in ("HGMMA", "QGMMA")}
    holding = [lp for lp in summary.loops if lp.addresses & mma]
    return [lp for lp in holding
            if not any(o is not lp and o.addresses < lp.addresses and o.addresses & mma for o in holding)]


def kernel_summary(compiled) -> SassSummary:
    """Summary of a ``CompiledKernel``'s own function."""
    return summarize(parse(disassemble(compiled.cubin, compiled.mangled_name)))


# Features: what a reader of the ladder looks for in each step's SASS -----------------------------------

_FEATURES = (  # (tag, opcode regex), in the order a table lists them
    ("TMA load", r"^UTMALDG"), ("TMA multicast", r"^UTMALDG.*MULTICAST"), ("TMA store", r"^UTMASTG"),
    ("mbarrier", r"^SYNCS"), ("mbarrier try-wait", r"^SYNCS\.PHASECHK.*TRYWAIT"), ("setmaxnreg", r"^USETMAXREG"),
    ("cluster barrier", r"^UCGABAR"), ("STSM", r"^STSM"), ("LDSM", r"^LDSM"), ("HMMA", r"^HMMA"),
    ("LDG.128", r"^LDG\.E\.128"), ("STG.128", r"^STG\.E\.128"), ("LDS.128", r"^LDS\.128"), ("STS.128", r"^STS\.128"),
    ("LDS", r"^LDS"), ("FFMA", r"^FFMA"), ("LDL/STL", r"^(LDL|STL)"),
)
_HGMMA_SHAPE = re.compile(r"^x(\d+)x(\d+)")


def features(summary: SassSummary) -> list[str]:
    """The SASS features a kernel shows, as short tags in a fixed order: the HGMMA shape (``HGMMA
    64x256x16``), TMA loads / multicast / stores, mbarriers, setmaxnreg, cluster barriers, STSM, 128-bit
    global and shared accesses, FFMA, local memory. Comparing a step's tags with the previous step's
    says what the step introduced."""
    out = []
    shapes = sorted({f"HGMMA {ins.opcode.split('.')[1]}x{m.group(1)}x{m.group(2)}"
                     for ins in summary.instructions if ins.base == "HGMMA"
                     for m in [_HGMMA_SHAPE.match(ins.operands)] if m and "." in ins.opcode},
                    key=lambda t: [int(x) for x in t.split()[1].split("x")])
    out += shapes
    out += [tag for tag, rx in _FEATURES if summary.has(rx)]
    return out
