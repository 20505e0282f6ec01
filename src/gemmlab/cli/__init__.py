"""The ``gemmlab`` command: a thin face over ``gemmlab.reports`` (and ``gemmlab.bench`` for timing).

``main`` parses the arguments (``parser``), runs one command module (``ladder``, ``inspect``, ``model``,
``bench``, ``tune``, ``figures``, ``serve``), which renders its reports as tables or JSON (``common``), and
is the one place where errors become a one-line message and an exit status:

    0 done, 1 failed (compile error, unreadable file, nothing ran), 2 usage (bad or unknown arguments,
    names, numbers), 3 needs an NVIDIA GPU and none is visible, 130 interrupted (Ctrl-C).

Modules are imported when their command runs, so ``--help`` and usage errors never load torch.
"""

from __future__ import annotations

import difflib
import importlib
import sys

from .parser import COMMANDS, UsageError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_GPU, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 0, 1, 2, 3, 130, 141

# command -> the module under gemmlab.cli that runs it (its ``run(args) -> int``)
_MODULES = {"ladder": "ladder", "inspect": "inspect", "model": "model", "explain": "model", "bench": "bench",
            "plot": "bench", "figures": "figures", "tune": "tune", "mcp": "serve"}

# The optional imports a command may need: the extra that brings each, and the requirement itself (gemmlab is
# installed from a clone, so `pip install gemmlab[extra]` would find nothing on an index).
EXTRAS = {"rich": ("cli", "rich>=13"), "matplotlib": ("plots", "matplotlib>=3.7"), "mcp": ("mcp", "mcp>=2.3,<3"),
          "mcp_types": ("mcp", "mcp>=2.3,<3"), "pydantic": ("mcp", "mcp>=2.3,<3")}


class NeedsGPU(Exception):
    """The command times kernels and torch sees no GPU (exit status 3)."""


def _has_gpu() -> bool:
    """Whether torch sees a CUDA GPU: the command's one probe (tests replace it)."""
    import torch

    return torch.cuda.is_available()


def _argv(argv: list[str]) -> list[str]:
    """Without a command, 'ladder' (also before its options); a mistyped command is answered with the
    closest ones instead of argparse's list."""
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "-V", "--version")):
        return ["ladder", *argv]
    if not argv[0].startswith("-") and argv[0] not in COMMANDS:
        close = difflib.get_close_matches(argv[0], COMMANDS, n=2, cutoff=0.5)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise UsageError(f"no command {argv[0]!r}; {hint}commands: {', '.join(COMMANDS)} (gemmlab --help)")
    return argv


def _missing_extra(e: ModuleNotFoundError) -> str | None:
    top = (e.name or "").split(".")[0]
    if top not in EXTRAS:
        return None
    extra, requirement = EXTRAS[top]
    return (f"this command needs the {top!r} package (gemmlab's [{extra}] extra): in gemmlab's folder, "
            f"pip install -e '.[{extra}]'; or pip install '{requirement}'")


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    from .. import log

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv = _argv(argv)
    except UsageError as e:
        print(f"gemmlab: {e}", file=sys.stderr)
        return EXIT_USAGE
    from .parser import build_parser

    args = build_parser().parse_args(argv)  # argparse exits with 2 on its own errors, 0 for --help/--version
    if args.verbose:
        log.configure("info" if args.verbose == 1 else "debug")
    name = f"gemmlab {args.command}"
    try:
        module = importlib.import_module(f".{_MODULES[args.command]}", __name__)
        return module.run(args)
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `gemmlab ... | head`: the reader went away; nothing left to say
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except Exception as e:  # noqa: BLE001 - the boundary: every error becomes a line and a status
        status, message = _classify(e)
        if status is None:
            if args.verbose:
                raise
            message += " (a bug in gemmlab: run again with -v for the traceback)"
            status = EXIT_FAILED
        print(f"{name}: {message}", file=sys.stderr)
        return status


def _classify(e: Exception) -> tuple[int | None, str]:
    """The exit status and message for an error; status None for an error gemmlab did not expect."""
    from ..errors import GemmlabError, UnsupportedProblem
    from ..reports import BadRequest

    if isinstance(e, (UsageError, BadRequest)):
        return EXIT_USAGE, str(e)
    if isinstance(e, NeedsGPU):
        return EXIT_NO_GPU, str(e)
    if isinstance(e, UnsupportedProblem):
        return EXIT_USAGE, str(e)
    if isinstance(e, GemmlabError):
        return EXIT_FAILED, str(e)
    if isinstance(e, ModuleNotFoundError) and _missing_extra(e):
        return EXIT_FAILED, _missing_extra(e)
    if isinstance(e, MemoryError):
        return EXIT_FAILED, "ran out of memory; try a smaller shape or fewer records"
    if isinstance(e, OSError):
        where = f" {e.filename}" if e.filename else ""
        return EXIT_FAILED, f"cannot use{where}: {e.strerror or e}"
    return None, f"{type(e).__name__}: {e}"
