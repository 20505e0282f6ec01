"""What every command shares: the consoles (full-width tables when the output is not a terminal), JSON
output, progress on stderr, number formats, where outputs go, and the GPU check."""

from __future__ import annotations

import json
import math
import os
import sys
from contextlib import contextmanager
from pathlib import Path

# Rich tables wrap to the terminal; written to a file or a pipe they are laid out this wide, so no column
# is cut (rich's own default there is 80).
PIPE_WIDTH = 250


def console(stderr: bool = False):
    """A rich console on stdout (or stderr): the terminal's width on a terminal, else ``COLUMNS`` or
    ``PIPE_WIDTH``; colour only on a terminal."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None
    if not stream.isatty():
        width = int(os.environ["COLUMNS"]) if os.environ.get("COLUMNS", "").isdigit() else PIPE_WIDTH
    return Console(file=stream, width=width)


def emit_json(data) -> None:
    """Print a report (or any JSON-able data holding reports) as JSON on stdout."""
    from ..reports import as_dict

    def plain(v):
        if hasattr(v, "__dataclass_fields__"):
            return as_dict(v)
        if isinstance(v, list):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return None if isinstance(v, float) and not math.isfinite(v) else v

    print(json.dumps(plain(data), indent=2))


@contextmanager
def progress(description: str, total: int):
    """A transient progress bar on stderr (shown only on a terminal); yields ``step(text)``, to call as each
    item starts."""
    from rich.progress import Progress

    err = console(stderr=True)
    with Progress(console=err, transient=True, disable=not err.is_terminal) as prog:
        task = prog.add_task(description, total=total)
        started = [False]

        def step(text: str) -> None:
            if started[0]:
                prog.advance(task)
            started[0] = True
            prog.update(task, description=text)

        yield step


def has_gpu() -> bool:
    """``gemmlab.cli._has_gpu()``, looked up at each call (tests replace it)."""
    from .. import cli

    return cli._has_gpu()


def require_gpu(what: str, remedy: str = "") -> None:
    """Raise ``NeedsGPU`` (exit status 3) when torch sees no GPU."""
    from . import NeedsGPU

    if not has_gpu():
        raise NeedsGPU(f"{what} needs an NVIDIA GPU, and torch sees none. " + (remedy or (
            "The static tools work without one: `gemmlab`, `gemmlab inspect`, `gemmlab model`, `gemmlab explain`, "
            "`gemmlab plot RECORDS.jsonl`.")))


def output_dir() -> Path:
    """Where records and plots go when no option names a place: ``GEMMLAB_OUT_DIR``, else
    ``$XDG_DATA_HOME/gemmlab`` (``~/.local/share/gemmlab``). Never the working folder's ``benchmarks/``."""
    override = os.environ.get("GEMMLAB_OUT_DIR")
    if override:
        return Path(override)
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "gemmlab"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def num(v, fmt: str, none: str = "-") -> str:
    """``format(v, fmt)`` for a finite number, else ``none``."""
    return format(v, fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else none


def shape_str(shape) -> str:
    return "x".join(str(int(v)) for v in shape)


def cfg_str(cfg: dict | None) -> str:
    return ",".join(f"{k}={v}" for k, v in (cfg or {}).items()) or "-"


def table(title: str, **kwargs):
    """A rich table with its title on the left (a centred title drifts far right in a wide pipe)."""
    from rich.table import Table

    return Table(title=title, title_justify="left", **kwargs)
