"""What the MCP server lets through: CUDA source that cannot read host files, compiled in a child process
under CPU, memory and wall-clock limits, so no ``#include`` reads a host file and no template bomb hangs
the server. Names and expressions are checked by pattern (``NAME_RE``, ``EXPR_RE``) before any lookup.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from ..reports import BadRequest

MAX_SOURCE_BYTES = 64 * 1024
USER_COMPILE_CPU_S = 60  # CPU seconds a user-source compile may take (child process)
USER_COMPILE_WALL_S = 120
USER_COMPILE_MEMORY = 16 * 2**30  # address space of that child

NAME_RE = r"^[a-z][a-z0-9_]{0,47}(\.[a-z][a-z0-9_]{0,47})?$"
# A kernel name or a template instantiation with literal arguments: integers, true/false, (qualified) type
# names. No parentheses, quotes, operators or semicolons, so nothing but an instantiation can be spelled.
_TARG = r"(-?[0-9]+[uUlL]{0,3}|true|false|[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)*)"
EXPR_RE = rf"^[A-Za-z_][A-Za-z0-9_]{{0,63}}(<\s*{_TARG}(\s*,\s*{_TARG}){{0,15}}\s*>)?$"

# Only gemmlab's headers (quoted, under gemmlab/kernels) and these CUDA headers may be included.
ALLOWED_SYSTEM_HEADERS = frozenset({
    "cuda_bf16.h", "cuda_fp16.h", "cuda_fp8.h", "mma.h", "cuda_pipeline.h", "cuda_awbarrier.h",
    "cooperative_groups.h", "cooperative_groups/memcpy_async.h", "cooperative_groups/reduce.h",
    "cuda/barrier", "cuda/pipeline", "cuda/ptx", "cuda/std/cstdint", "cuda/std/type_traits", "cuda/std/utility",
    "cuda/std/array", "cuda/std/limits",
})
_INCLUDE_LINE = re.compile(r'^\s*#\s*include\s*(?:"([A-Za-z0-9_]+/[A-Za-z0-9_]+\.cuh)"|<([A-Za-z0-9_/.]+)>)\s*$')
_DIRECTIVE_WORD = re.compile(r"(#|%:)\s*(embed|import|include_next)\b")


def check_source(code: str) -> None:
    """Refuse source that could make the compiler read a host file or that is too large.

    Every line that mentions ``include`` (after joining backslash-continued lines, as the preprocessor does)
    must be a plain ``#include "dir/name.cuh"`` of a gemmlab header or ``#include <name>`` of an allowed CUDA
    header: computed includes (``#include MACRO``), ``__has_include``, absolute or ``..`` paths, digraph and
    trigraph spellings, token pasting (which could assemble those names), ``#embed``, ``#import`` and
    ``#pragma GCC dependency`` are refused."""
    from ..jit.compiler import KERNEL_ROOT

    if len(code.encode("utf-8", errors="replace")) > MAX_SOURCE_BYTES:
        raise BadRequest(f"source is larger than {MAX_SOURCE_BYTES} bytes")
    if "\x00" in code:
        raise BadRequest("source contains a NUL byte")
    if "??=" in code or "??/" in code:
        raise BadRequest("source contains a trigraph (??= or ??/); spell # and \\ directly")
    # Without token pasting and digraphs, `__has_include` and friends can only be spelled literally (and are
    # then caught below).
    if "##" in code or "%:" in code:
        raise BadRequest("token pasting (##) and the %: digraph are not allowed in source passed to the server")
    if re.search(r"\bdependency\b", code):
        raise BadRequest("'dependency' is not allowed (#pragma GCC dependency reads a host file's date)")
    joined = re.sub(r"\\\r?\n", "", code)
    root = KERNEL_ROOT.resolve()
    for n, line in enumerate(joined.splitlines(), 1):
        if _DIRECTIVE_WORD.search(line):
            raise BadRequest(f"line {n}: #embed, #import and #include_next are not allowed")
        if "include" not in line:
            continue
        m = _INCLUDE_LINE.match(line)
        if m is None:
            raise BadRequest(f"line {n}: only plain '#include \"common/<name>.cuh\"' (gemmlab headers) and "
                             f"'#include <header>' of {sorted(ALLOWED_SYSTEM_HEADERS)} are allowed, one per line, and "
                             "'include' may not appear elsewhere (no computed includes, no __has_include)")
        quoted, system = m.groups()
        if quoted is not None:
            path = (root / quoted).resolve()
            if root not in path.parents or not path.is_file():
                raise BadRequest(f"line {n}: {quoted!r} is not a gemmlab header (e.g. \"common/tma.cuh\", "
                                 "\"common/wgmma.cuh\", \"sgemm/vec_io.cuh\")")
        elif system not in ALLOWED_SYSTEM_HEADERS:
            raise BadRequest(f"line {n}: <{system}> is not an allowed header; allowed: "
                             f"{sorted(ALLOWED_SYSTEM_HEADERS)}")


# The child that compiles user source: fixed code, the request on stdin, limits set before anything is imported.
_COMPILE_CHILD = r"""
import json, sys
cpu, mem = int(sys.argv[1]), int(sys.argv[2])
try:
    import resource
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
except ImportError:  # not POSIX: the parent's wall-clock limit still applies
    pass
req = json.loads(sys.stdin.read())
from gemmlab import inspect as gi
from gemmlab.errors import GemmlabError
try:
    gi.compile_source(req["code"], req["expr"], req["arch"])
    ptx = gi.ptx_for_source(req["code"], req["expr"], req["arch"])[:4 << 20] if req["ptx"] else None
    out = {"ok": True, "ptx": ptx}
except GemmlabError as e:
    out = {"ok": False, "error": str(e)}
sys.stdout.write(json.dumps(out))
"""


def compile_user_source(code: str, expr: str, arch: str, want_ptx: bool):
    """Compile in a child process under limits (it fills the disk cache), then load the result here from the
    cache. Returns (CompiledKernel, PTX text or None). Compiler messages name the source ``source.cu``."""
    from .. import inspect as gi

    pkg_parent = str(Path(__file__).resolve().parent.parent.parent)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([pkg_parent, *filter(None, [os.environ.get("PYTHONPATH")])]))
    try:
        proc = subprocess.run([sys.executable, "-c", _COMPILE_CHILD, str(USER_COMPILE_CPU_S), str(USER_COMPILE_MEMORY)],
                              input=json.dumps({"code": code, "expr": expr, "arch": arch, "ptx": want_ptx}),
                              capture_output=True, text=True, timeout=USER_COMPILE_WALL_S, env=env)
    except subprocess.TimeoutExpired:
        raise BadRequest(f"compiling the source took longer than {USER_COMPILE_WALL_S} s; it was stopped") from None
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        why = "it ran out of CPU time or memory" if proc.returncode < 0 else proc.stderr.strip()[-2000:]
        raise BadRequest(f"the compiler process failed (status {proc.returncode}): "
                         f"{gi.cite_source(why, 'source.cu')}") from None
    if not out["ok"]:
        raise BadRequest("CompileError: " + gi.cite_source(out["error"], "source.cu"))
    return gi.compile_source(code, expr, arch), out["ptx"]
