"""``gemmlab tune``: time a step's configs at a shape on this GPU and save the winner (``gemmlab.autotune``);
``--show`` lists what is saved."""

from __future__ import annotations

from .common import cfg_str, console, emit_json, has_gpu, num, require_gpu, table
from .parser import UsageError


def run(args) -> int:
    from .. import autotune
    from ..reports import find_step

    out = console(stderr=args.json)  # with --json, stdout holds only the JSON
    if args.show:
        return _show_tuned(out, args.kernel, args.json)
    if not args.kernel or not args.shape:
        raise UsageError("name a step and a shape (gemmlab tune k08 --shape 4096,4096,4096), or --show")
    spec = find_step(args.kernel)
    why = autotune.tunable(spec)
    if why:
        raise UsageError(f"{spec.name} cannot be tuned: {why}")
    require_gpu("tuning", "`gemmlab tune --show` lists saved results without one.")
    M, N, K = args.shape
    res = autotune.tune(spec, M, N, K, configs=args.configs, max_configs=args.max_configs, rounds=args.rounds,
                        budget_s=args.budget, log=lambda msg: out.print(msg, markup=False, highlight=False))
    if args.json:
        emit_json({"kernel": spec.name, "shape": [M, N, K], "gpu": res.gpu.describe(), "winner": res.config,
                   "heuristic": res.heuristic, "saved_to": str(res.saved_to) if res.winner else None,
                   "candidates": res.latest()})
        return 0 if res.winner is not None else 1
    t = table(f"{spec.name} at {M}x{N}x{K} on {res.gpu.describe()}: {len(res.candidates)} candidates, "
                    f"{args.rounds} rounds (the final round's numbers where a candidate had one)")
    for col in ("config", "TFLOP/s", "x cuBLAS", "correct", "rel err", ""):
        t.add_column(col, justify="right" if col in ("TFLOP/s", "x cuBLAS", "rel err") else "left")
    rows = sorted(res.latest(), key=lambda r: (r.get("time_ms") is None, r.get("time_ms") or 0.0))
    for r in rows:
        note = []
        if r is res.winner:
            note.append("[bold green]winner[/bold green]")
        if r.get("config") == res.heuristic:
            note.append("the step's own choice")
        if r.get("error"):
            note.append(f"[red]{r['error']}[/red]")
        t.add_row(cfg_str(r.get("config")), num(r.get("tflops"), ".1f"), num(r.get("ratio"), ".3f"),
                  "yes" if r.get("correct") is True else "[red]no[/red]", num(r.get("rel_error"), ".1e"),
                  ", ".join(note))
    out.print(t)
    if res.winner is None:
        out.print("[red]no candidate was correct: nothing saved[/red]")
        return 1
    h = res.heuristic_record()
    if h is not None and h.get("time_ms") and h is not res.winner:
        out.print(f"winner {cfg_str(res.config)}: x{h['time_ms'] / res.winner['time_ms']:.3f} over the step's "
                  f"own choice {cfg_str(res.heuristic)}")
    out.print(f"saved to {res.saved_to} (KernelSpec.config_for now picks it for this shape on this GPU)",
              markup=False, highlight=False, soft_wrap=True)
    return 0


def _show_tuned(out, kernel: str | None, as_json: bool = False) -> int:
    from .. import autotune, registry
    from ..reports import find_step

    name = find_step(kernel).name if kernel else None
    gpu = autotune.current_gpu() if has_gpu() else None
    rows = [(ident, path, e) for ident, path, e in autotune.saved_entries(gpu) if name in (None, e["kernel"])]
    where = f"{gpu.describe()}, {autotune.tuned_path(gpu)}" if gpu else f"every GPU, {autotune.tune_dir()}"
    if as_json:
        emit_json([{"gpu": ident, **e} for ident, _path, e in rows])
        return 0
    if not rows:
        out.print(f"no tuned results for {name or 'any step'} ({where})", markup=False, highlight=False)
        return 0
    t = table(f"tuned results: {where}")
    cols = ("kernel", "shape", "config", "ms", "TFLOP/s", "x cuBLAS", "git sha", "when")
    for col in ((() if gpu else ("GPU",)) + cols):
        t.add_column(col, overflow="fold")

    def in_param_order(e: dict) -> dict:  # the file keeps keys sorted; show them as the step lists them
        try:
            names = registry.get(e["kernel"]).param_names()
        except KeyError:
            return e["config"]
        return {**{k: e["config"][k] for k in names if k in e["config"]}, **e["config"]}

    for ident, _path, e in rows:
        gpu_col = () if gpu else (
            f"{ident.get('name')} ({ident.get('sm_count')} SMs, driver {ident.get('driver_major')})",)
        t.add_row(*gpu_col, str(e["kernel"]).split(".", 1)[-1], f"{e['M']}x{e['N']}x{e['K']}", cfg_str(in_param_order(e)),
                  num(e.get("time_ms"), ".4f"), num(e.get("tflops"), ".1f"), num(e.get("ratio"), ".3f"),
                  str(e.get("git_sha", "-")), str(e.get("when", "-")))
    out.print(t)
    return 0
