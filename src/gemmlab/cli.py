"""The ``gemmlab`` command. ``gemmlab`` alone walks both ladders (the static view without a GPU)."""

from __future__ import annotations

import argparse
import sys


def _cmd_ladder(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from . import registry, sass
    from .jit.launch import torch

    console = Console()
    has_gpu = torch.cuda.is_available()
    for lad_name, lad in registry.ladders().items():
        if args.ladder and lad_name != args.ladder:
            continue
        table = Table(title=f"{lad_name}: {lad.title} ({lad.layout}: {lad.layout_doc})")
        for col in ("step", "technique", "regs", "smem KB", "spills", "SASS checks"):
            table.add_column(col)
        for spec in registry.all_kernels(lad_name):
            ck = spec.compile()
            summ = sass.kernel_summary(ck)
            fails = sass.check(spec.sass, summ, ck.resources)
            smem = (spec.smem_bytes(spec.default_config()) + ck.resources.static_shared) / 1024
            table.add_row(spec.short, spec.technique, str(ck.resources.registers), f"{smem:.1f}",
                          "yes" if ck.resources.spills else "no",
                          "ok" if not fails else "FAIL: " + "; ".join(fails))
        console.print(table)
    if not has_gpu:
        console.print("[yellow]No GPU visible: timings (TFLOP/s, ratio to cuBLAS) need an NVIDIA GPU; "
                      "this is the static view (compile, resources, SASS checks).[/yellow]")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gemmlab", description=__doc__)
    sub = p.add_subparsers(dest="command")
    lad = sub.add_parser("ladder", help="walk the kernel ladders: technique, resources, SASS checks")
    lad.add_argument("--ladder", choices=("sgemm", "hopper"), help="only this ladder")
    lad.set_defaults(func=_cmd_ladder)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["ladder"] + (argv or []))
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
