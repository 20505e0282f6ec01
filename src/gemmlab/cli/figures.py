"""``gemmlab figures``: the subject's figures, drawn from the code the kernels and models use."""

from __future__ import annotations

from .common import console


def run(args) -> int:
    from ..figures import make_figures

    paths = make_figures(args.out, args.only, formats=tuple(args.format))
    console().print(f"{len(paths)} files: " + ", ".join(str(p) for p in paths), markup=False, highlight=False)
    return 0
