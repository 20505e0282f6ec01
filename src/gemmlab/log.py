"""gemmlab's logger and the environment switch that turns it on.

Every module logs under the ``gemmlab`` logger (``gemmlab.log.logger``, or a child such as
``logging.getLogger("gemmlab.jit")``). A library stays quiet by default: nothing is printed unless the
application configures logging, or ``GEMMLAB_LOG`` names a level when gemmlab is imported::

    GEMMLAB_LOG=debug python train.py      # which kernel and plan each call runs, JIT compile times
    GEMMLAB_LOG=info gemmlab inspect k05   # the same switch for the command (or: gemmlab inspect k05 -v)

What is logged where: DEBUG for per-call decisions (the route and plan ``gemmlab.matmul`` picks, a cache
hit or miss, each compile with its time), INFO for one-off events worth a line (a cold compile, a tuned
plan loaded), WARNING for something the user should fix (an unwritable cache folder).
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager

ENV = "GEMMLAB_LOG"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}

logger = logging.getLogger("gemmlab")
logger.addHandler(logging.NullHandler())  # no "No handlers could be found" noise in applications

_handler: logging.Handler | None = None


def level_from_env(value: str | None = None) -> int | None:
    """The level ``GEMMLAB_LOG`` (or ``value``) names: ``debug``, ``info``, ``warning``, ``error`` or a
    number; None when unset or empty. Raises ``ValueError`` for anything else, naming the choices."""
    text = (os.environ.get(ENV, "") if value is None else value).strip().lower()
    if not text:
        return None
    if text.isdigit():
        return int(text)
    try:
        return LEVELS[text]
    except KeyError:
        raise ValueError(f"{ENV}={text!r}: expected one of {', '.join(LEVELS)}") from None


def configure(level: int | str | None = None) -> None:
    """Send the ``gemmlab`` logger's records at ``level`` and above to stderr (one handler, however often
    this is called). ``level`` defaults to ``GEMMLAB_LOG``; with neither, nothing changes."""
    global _handler
    if isinstance(level, str):
        level = level_from_env(level)
    elif level is None:
        level = level_from_env()
    if level is None:
        return
    if _handler is None:
        _handler = logging.StreamHandler()
        _handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
        logger.addHandler(_handler)
    logger.setLevel(level)


def reset() -> None:
    """Undo ``configure``: remove its handler and leave the level to the application."""
    global _handler
    if _handler is not None:
        logger.removeHandler(_handler)
        _handler = None
    logger.setLevel(logging.NOTSET)


def configure_from_env() -> None:
    """``configure()`` at import; a bad ``GEMMLAB_LOG`` value is reported once as a warning, never raised
    (an environment variable must not make ``import gemmlab`` fail)."""
    try:
        configure()
    except ValueError as e:
        import warnings

        warnings.warn(str(e), stacklevel=3)


@contextmanager
def timed(message: str, *args, level: int = logging.DEBUG):
    """Log ``message % args`` followed by the elapsed time when the block ends; costs one level check
    when the level is off::

        with timed("compiled %s for %s", name, arch):
            ...
    """
    if not logger.isEnabledFor(level):
        yield
        return
    start = time.perf_counter()
    yield
    logger.log(level, message + " in %.3f s", *args, time.perf_counter() - start)
