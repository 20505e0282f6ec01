"""What gemmlab's tools show, computed once: the command (``gemmlab.cli``) renders these reports as tables
or JSON, the MCP server (``gemmlab.mcp``) returns them as typed tool results.

Each report is a plain dataclass whose fields carry a one-line description (``doc``) that the MCP schema
shows to agents; ``as_dict`` turns any of them into JSON-able data.

- ``modelling``: a problem's roofline and speed of light, a step's model at a shape (occupancy, waves,
  predicted time), every step's prediction, and ``explain`` (the model's limiters, what it does not price).
- ``compiled``: what the compiler made of a kernel (``inspect``), two kernels compared (``diff``), and the
  ladder's static rows (registers, smem, occupancy, the SASS each step introduces, the model).
- ``records``: benchmark records read back (checked, with a line number when one is bad), the model added
  to them, the rows of a records table, and measurements on a GPU.

Requests are checked here, for both faces: names (``find_step``, with short forms such as ``k6`` and a
did-you-mean), sizes (``check_dims``), clocks (``check_clock``). Failures raise ``BadRequest`` (a
``ValueError``) with a message that says what to pass instead.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re

from ..errors import GemmlabError

MAX_DIM = 131072  # each of M, N, K a tool models or times (2^17: beyond any GEMM of a real model)
MIN_CLOCK_MHZ, MAX_CLOCK_MHZ = 100.0, 3000.0


class BadRequest(GemmlabError, ValueError):
    """A request a report cannot answer as asked: an unknown name, a size or clock out of range, a config
    the step does not have, a file that holds no benchmark records. The message says what to do."""


def doc(text: str, **kwargs):
    """A dataclass field with a description (the MCP schema's ``description``)."""
    return dataclasses.field(metadata={"doc": text}, **kwargs)


def as_dict(report) -> dict:
    """A report (or a list of them) as JSON-able data: dataclasses to dicts, non-finite floats to None."""
    def clean(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {str(k): clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v

    if isinstance(report, list):
        return clean([dataclasses.asdict(r) for r in report])
    return clean(dataclasses.asdict(report))


# Names ----------------------------------------------------------------------------------------------------

_STEP_FILE = re.compile(r"^[a-z]\d\d_\w+$")


@functools.lru_cache(maxsize=1)
def step_names() -> tuple[str, ...]:
    """Every ladder step's full name (``sgemm.k05_blocktile_2d``), read from the kernel files (one
    ``kernels/<ladder>/<step>.cu`` per step) without loading the registry, so a typo is answered at once.
    ``tests/test_reports.py`` checks that this list is the registry's."""
    from ..jit.compiler import KERNEL_ROOT

    return tuple(sorted(f"{p.parent.name}.{p.stem}" for p in KERNEL_ROOT.glob("*/*.cu") if _STEP_FILE.match(p.stem)))


def _short_forms(full: str) -> set[str]:
    """``hopper.h04_two_consumers`` -> its short names: ``h04_two_consumers``, ``h04``, ``h4``, and the
    ladder-qualified ones."""
    ladder, short = full.split(".", 1)
    step = short.split("_", 1)[0]  # h04
    forms = {full, short, step, step[0] + str(int(step[1:]))}
    return forms | {f"{ladder}.{f}" for f in forms}


def resolve_step_name(name: str) -> str:
    """The full registry name for ``name``: a full name, ``k05_blocktile_2d``, ``k05``, ``k5`` or
    ``sgemm.k5`` (any case). Raises ``BadRequest`` with the closest names for anything else."""
    key = name.strip().lower()
    for full in step_names():
        if key in _short_forms(full):
            return full
    shorts = [full.split(".", 1)[1] for full in step_names()]
    candidates = shorts + [s.split("_", 1)[0] for s in shorts]
    close = difflib.get_close_matches(key.split(".")[-1], candidates, n=6, cutoff=0.6)
    named = list(dict.fromkeys(next(s for s in shorts if s.startswith(c)) for c in close))[:3]
    hint = f"; did you mean {' or '.join(named)}?" if named else "."
    raise BadRequest(f"no kernel named {name!r}{hint} Known: {', '.join(step_names())} "
                     "(short forms such as k05, k5 or h04 work too)")


def find_step(name: str):
    """The registry's ``KernelSpec`` for ``name`` (see ``resolve_step_name``)."""
    from .. import registry

    return registry.get(resolve_step_name(name))


# Numbers -----------------------------------------------------------------------------------------------------

def check_dims(M: int, N: int, K: int, what: str = "M, N, K") -> None:
    """Each dimension in 1..MAX_DIM (the model and the timer work up to there; larger numbers are typos)."""
    for v in (M, N, K):
        if not isinstance(v, int) or not 1 <= v <= MAX_DIM:
            raise BadRequest(f"{what} = {M}, {N}, {K}: each must be an integer from 1 to {MAX_DIM}")


def check_clock(clock_mhz: float | None) -> None:
    """An SM clock in MIN_CLOCK_MHZ..MAX_CLOCK_MHZ (None means the profile's sustained clock)."""
    if clock_mhz is None:
        return
    if not (isinstance(clock_mhz, (int, float)) and math.isfinite(clock_mhz)
            and MIN_CLOCK_MHZ <= clock_mhz <= MAX_CLOCK_MHZ):
        raise BadRequest(f"SM clock {clock_mhz} MHz: expected {MIN_CLOCK_MHZ:.0f} to {MAX_CLOCK_MHZ:.0f} MHz "
                         "(the H200 sustains about 1320-1550 under load and boosts to 1980)")


def gpu_available() -> bool:
    """Whether torch sees a CUDA GPU (no torch CUDA at all counts as none)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken CUDA install is "no GPU" to the tools
        return False
