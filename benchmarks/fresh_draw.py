"""A fresh draw of shapes the project never tuned on (CPU only): issue 14's "checked on shapes you never saw".

    PYTHONPATH=src python3 benchmarks/fresh_draw.py --seed 5401 --count 48

Prints one ``--shapes`` argument for ``engine_broad.py --lean --decode-beside`` (the device step ``fresh``
in ``device_steps.sh`` runs it with ``FR_SEED`` / ``FR_COUNT``); its records are summarized like the broad
set's: ``engine_broad_summary.py --file <records> --sha <sha>``.

Each shape is a projection (``gemmlab.broad_shapes.projections``: fused QKV or q / kv, attention output,
gate+up or up, down) of a model from ``HELD_OUT`` (families and sizes the broad set does not name) or a
vocabulary head of one, at a token count drawn log-uniformly from 1 to 16384 as a plain integer (so most
are not multiples of 8, 64 or 128). A shape already in the broad set, or above the broad set's FLOP cap,
is drawn again. A new seed is a new draw; each session's seed is named in its records' notes. (Session 54's
draws of seeds 5401-5404 and 5410-5411 were made with EXAONE-3's key-value heads read as 32, not 8: its
fused QKV came out 12288 x 4096, Llama-2-7B's, where it is 6144 x 4096.)
"""

from __future__ import annotations

import argparse
import math
import random

from gemmlab.broad_shapes import MAX_FLOP, broad_cases, classify, projections

# model -> (hidden, intermediate, q heads, kv heads, head dim, gated MLP, fused projections); public configs
HELD_OUT = {
    "yi-34b": (7168, 20480, 56, 8, 128, True, False),
    "internlm2-20b": (6144, 16384, 48, 8, 128, True, True),
    "command-r-35b": (8192, 22528, 64, 64, 128, True, False),
    "stablelm2-1.6b": (2048, 5632, 32, 32, 64, True, False),
    "baichuan2-13b": (5120, 13696, 40, 40, 128, True, True),
    "glm4-9b": (4096, 13696, 32, 2, 128, True, True),
    "granite3-8b": (4096, 12800, 32, 8, 128, True, False),
    "nemotron4-15b": (6144, 24576, 48, 8, 128, False, False),
    "minicpm-2b": (2304, 5760, 36, 36, 64, True, False),
    "smollm2-1.7b": (2048, 8192, 32, 32, 64, True, False),
    "olmo2-13b": (5120, 13824, 40, 40, 128, True, False),
    "exaone3-7.8b": (4096, 14336, 32, 8, 128, True, True),
    "starcoder2-15b": (6144, 24576, 48, 4, 128, False, True),
    "dbrx-dense-equiv": (6144, 10752, 48, 8, 128, True, True),
}
# vocabulary -> hidden of a model that uses it (N = vocab, K = hidden)
HEADS = {"phi4": (100352, 5120), "smollm2": (49152, 2048), "internlm2": (92544, 6144), "glm4": (151552, 4096)}


def draw(seed: int, count: int, m_range: tuple[int, int] = (1, 16384)) -> list[tuple[int, int, int]]:
    """``count`` distinct (M, N, K), none of them in the broad set."""
    rnd = random.Random(seed)
    pairs = sorted({nk for dims in HELD_OUT.values() for nk in projections(*dims).values()} | set(HEADS.values()))
    seen = {c.shape for c in broad_cases()}
    out: list[tuple[int, int, int]] = []
    lo, hi = math.log(m_range[0]), math.log(m_range[1] + 1)
    for _ in range(100 * count):
        if len(out) == count:
            break
        N, K = rnd.choice(pairs)
        M = min(m_range[1], int(math.exp(rnd.uniform(lo, hi))))
        s = (M, N, K)
        if s not in seen and s not in out and 2.0 * M * N * K <= MAX_FLOP:
            out.append(s)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--count", type=int, default=48)
    p.add_argument("--classes", action="store_true", help="also print each shape's class, one per line")
    args = p.parse_args()
    shapes = draw(args.seed, args.count)
    if args.classes:
        for s in shapes:
            print(*s, classify(*s))
    print(";".join(",".join(map(str, s)) for s in shapes))


if __name__ == "__main__":
    main()
