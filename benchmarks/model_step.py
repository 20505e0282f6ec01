"""A decoder's training and inference step, patched with gemmlab against plain torch, eager (issue 17).

The model is tests/decoder_block.py's Llama-style decoder (RMSNorm, q/k/v/o projections with grouped KV
heads and rotary positions, causal SDPA, SwiGLU MLP, tied lm_head), bf16 weights, random, two copies
from one seed: one left to torch, one ``gemmlab.patch``ed (every nn.Linear on gemmlab, forward and
backward). Before timing: ``gemmlab.warmup(model, tokens=..., backward=True)`` compiles every kernel
(its report goes in the records), the logits of the two are compared, and one AdamW step each is taken
(their losses compared).

Steps, each timed as wall time over a few steps with one synchronize, eager (no CUDA graphs, no
torch.compile: the host path counts), torch and gemmlab interleaved round by round, medians kept:
- ``train``: forward, next-token cross entropy, backward, AdamW step, zero_grad;
- ``prefill``: forward under inference_mode at the training shape;
- ``decode``: forward of one token for each of ``--decode-batch`` sequences (the GEMMs at M = batch).

Records (JSON lines, appended to ``--out``): git sha, GPU, driver, torch, SM clock sampled after each
round (median), model config, tokens, both times in ms, ratio = torch / gemmlab (> 1: gemmlab faster),
the logits' relative error, the first-step losses, the warm-up's kernels and seconds.

    PYTHONPATH=src python benchmarks/model_step.py --out benchmarks/results/model_step.jsonl
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime as dt
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))  # the model definition the tests check

import decoder_block as db  # noqa: E402

import gemmlab  # noqa: E402
from gemmlab.bench import append_records, git_sha, rel_error  # noqa: E402
from gemmlab.gpu import gpu_info, sample_clocks  # noqa: E402

CONFIGS = {
    # ~1B-parameter-class layer widths, 4 layers: ~250 M parameters with the tied 32k vocabulary.
    "llama-1b-ish": db.Config(vocab=32000, dim=2048, heads=16, kv_heads=8, ffn=5632, layers=4),
    # Wider layers (Llama-2-7B widths), 2 layers.
    "llama-7b-ish": db.Config(vocab=32000, dim=4096, heads=32, kv_heads=8, ffn=11008, layers=2),
    "tiny": db.Config(),  # for a smoke run of this script (--device cpu): times mean nothing
}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_ms(fn, steps: int) -> float:
    """Wall time per step of ``steps`` back-to-back eager steps and one synchronize."""
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    sync()
    return (time.perf_counter() - t0) / steps * 1e3


def interleaved(fns: dict, steps: int, rounds: int) -> tuple[dict, float | None]:
    """Median ms per step of each function, rounds interleaved; the median SM clock after each round."""
    times = {k: [] for k in fns}
    clocks = []
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(timed_ms(fn, steps))
            clocks.append(sample_clocks().sm_mhz)
    clocks = [c for c in clocks if c is not None]
    return {k: statistics.median(v) for k, v in times.items()}, (statistics.median(clocks) if clocks else None)


def train_step(model, opt, tokens):
    def step():
        loss = db.loss_fn(model, tokens)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def infer_step(model, tokens):
    def step():
        with torch.inference_mode():
            model(tokens)
    return step


def run_config(name: str, cfg: db.Config, batch: int, seq: int, decode_batch: int, steps: int,
               rounds: int, device: str = "cuda") -> list[dict]:
    gpu = gpu_info() if device == "cuda" else None
    dtype = torch.bfloat16
    ref = db.build(cfg, seed=0, device=device, dtype=dtype)
    ours = copy.deepcopy(ref)
    gemmlab.patch(ours)
    gen = torch.Generator(device).manual_seed(1)
    tokens = torch.randint(0, cfg.vocab, (batch, seq + 1), device=device, generator=gen)
    inputs = tokens[:, :-1].contiguous()
    one = torch.randint(0, cfg.vocab, (decode_batch, 1), device=device, generator=gen)

    report = gemmlab.warmup(ours, tokens=[batch * seq, decode_batch], backward=True)
    print(report.summary().splitlines()[0], flush=True)

    with torch.inference_mode():
        err = rel_error(ours(inputs), ref(inputs).double())
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-4)
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=1e-4)
    first = {}
    for key, model, opt in (("torch", ref, opt_ref), ("gemmlab", ours, opt_ours)):
        loss = db.loss_fn(model, tokens)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        first[key] = loss.item()

    cases = {
        "train": ({"torch": train_step(ref, opt_ref, tokens), "gemmlab": train_step(ours, opt_ours, tokens)},
                  batch * seq),
        "prefill": ({"torch": infer_step(ref, inputs), "gemmlab": infer_step(ours, inputs)}, batch * seq),
        "decode": ({"torch": infer_step(ref, one), "gemmlab": infer_step(ours, one)}, decode_batch),
    }
    recs = []
    for kind, (fns, rows) in cases.items():
        for fn in fns.values():  # warm: allocator, cuBLAS handles, prepared calls, optimizer state
            for _ in range(2):
                fn()
        n = steps if kind != "decode" else steps * 5
        ms, clock = interleaved(fns, n, rounds)
        rec = {"time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "git_sha": git_sha(),
               "gpu": gpu.name if gpu else device, "driver": gpu.driver if gpu else None, "torch": torch.__version__,
               "suite": "model_step", "kind": kind, "model": name, "config": dataclasses.asdict(cfg),
               "batch": batch if kind != "decode" else decode_batch,
               "seq": seq if kind != "decode" else 1, "rows": rows, "dtype": "bfloat16",
               "sm_clock_mhz": clock, "gemmlab_ms": ms["gemmlab"], "torch_ms": ms["torch"],
               "ratio": ms["torch"] / ms["gemmlab"], "logits_rel_error": err, "first_loss": first,
               "warmup_kernels": len(report.kernels), "warmup_s": report.seconds,
               "warmup_compile_s": report.compile_seconds, "steps": n, "rounds": rounds}
        recs.append(rec)
        print(f"{name:<13} {kind:<8} rows {rows:>6}: gemmlab {ms['gemmlab']:8.2f} ms  torch {ms['torch']:8.2f} ms  "
              f"x{rec['ratio']:.3f}  (SM {clock} MHz; logits err {err:.1e}; first losses "
              f"{first['gemmlab']:.4f} / {first['torch']:.4f})", flush=True)
    del ref, ours, opt_ref, opt_ours
    if device == "cuda":
        torch.cuda.empty_cache()
    return recs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results/model_step.jsonl")
    ap.add_argument("--models", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--decode-batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5, help="steps per timed round (x5 for decode)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script (gemmlab falls back)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("model_step.py times eager steps on a GPU; torch sees none", file=sys.stderr)
        return 2
    recs = []
    for name in args.models.split(","):
        recs += run_config(name, CONFIGS[name], args.batch, args.seq, args.decode_batch, args.steps, args.rounds,
                           args.device)
    append_records(args.out, recs)
    print(f"{len(recs)} records appended to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
