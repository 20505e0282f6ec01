"""Shape suites for ``gemmlab.matmul``: the problems its bars are measured on (issue 5).

Every case is an nn.Linear-style product in the TN layout: ``a = x`` (M, K) row-major, ``b = w.t()`` with
``w`` (N, K) row-major, optionally with a fused bias and activation. M counts tokens, N output features,
K input features. Pure data: nothing here needs a GPU or torch.

- ``square``: M = N = K over ``gemmlab.suites.SQUARE_SIZES``.
- ``llm``: Llama-3-8B and -70B projections, prefill (M = 512 .. 16384) and decode (M = 1 .. 128).
- ``prefill``: the prefill half of ``llm`` (M = 512 .. 16384: compute-bound).
- ``decode``: the decode half of ``llm`` (memory-bound: the weight is streamed once).
- ``unaligned``: sizes whose leading dimensions are not 16-byte multiples, or not tile multiples.
- ``epilogue``: a few ``llm`` shapes with bias + gelu / silu fused (against torch.mm + separate ops).
- ``broad``: issue 14's broad set (``gemmlab.broad_shapes``): 300+ projections of many model families at
  M = 1 .. 16384, aligned and not.
"""

from __future__ import annotations

from dataclasses import dataclass

from .suites import SQUARE_SIZES


@dataclass(frozen=True)
class MatmulCase:
    name: str
    M: int
    N: int
    K: int
    bias: bool = False
    activation: str | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.M, self.N, self.K)

    @property
    def flops(self) -> float:
        return 2.0 * self.M * self.N * self.K


# (N, K) of each projection; projections with the same shape are one case ("k_proj,v_proj").
LLAMA3_PROJECTIONS: dict[str, dict[str, tuple[int, int]]] = {
    "llama3_8b": {  # hidden 4096, 32 query / 8 KV heads of 128, MLP 14336
        "q_proj,o_proj": (4096, 4096),
        "k_proj,v_proj": (1024, 4096),
        "gate_proj,up_proj": (14336, 4096),
        "down_proj": (4096, 14336),
    },
    "llama3_70b": {  # hidden 8192, 64 query / 8 KV heads of 128, MLP 28672
        "q_proj,o_proj": (8192, 8192),
        "k_proj,v_proj": (1024, 8192),
        "gate_proj,up_proj": (28672, 8192),
        "down_proj": (8192, 28672),
    },
}
PREFILL_M = (512, 2048, 8192, 16384)
DECODE_M = (1, 16, 64, 128)


def _llm(ms: tuple[int, ...], phase: str) -> tuple[MatmulCase, ...]:
    return tuple(MatmulCase(f"{model}.{proj} {phase} M={m}", m, n, k)
                 for model, projs in LLAMA3_PROJECTIONS.items() for proj, (n, k) in projs.items() for m in ms)


SQUARE = tuple(MatmulCase(f"square {n}", n, n, n) for n in SQUARE_SIZES)
PREFILL = _llm(PREFILL_M, "prefill")
DECODE = _llm(DECODE_M, "decode")
LLM = PREFILL + DECODE
UNALIGNED = tuple(MatmulCase(f"unaligned {m}x{n}x{k}", m, n, k) for m, n, k in (
    (4095, 4095, 4095), (8191, 8191, 8191), (4096, 4096, 4095), (4100, 4100, 4100),
    (5000, 3000, 2000), (3000, 5000, 1000)))
EPILOGUE = (
    MatmulCase("llama3_8b.up_proj prefill M=2048 bias+gelu", 2048, 14336, 4096, bias=True, activation="gelu"),
    MatmulCase("llama3_8b.gate_proj prefill M=2048 silu", 2048, 14336, 4096, activation="silu"),
    MatmulCase("llama3_8b.q_proj prefill M=8192 bias+gelu_tanh", 8192, 4096, 4096, bias=True,
               activation="gelu_tanh"),
    MatmulCase("llama3_70b.gate_proj prefill M=8192 silu", 8192, 28672, 8192, activation="silu"),
    MatmulCase("llama3_70b.up_proj prefill M=512 bias+gelu", 512, 28672, 8192, bias=True, activation="gelu"),
    MatmulCase("llama3_8b.gate_proj decode M=16 silu", 16, 14336, 4096, activation="silu"),
)

# Eager calls (issue 13): decode and small prefill, where an eager call's host time can exceed its GPU time.
EAGER_WEIGHTS = ((4096, 4096), (14336, 4096), (4096, 14336), (1024, 4096), (8192, 8192), (16384, 16384))
EAGER = tuple(MatmulCase(f"eager {m}x{n}x{k}", m, n, k) for n, k in EAGER_WEIGHTS for m in (1, 8, 16, 32)) + tuple(
    MatmulCase(f"eager {m}x4096x4096", m, 4096, 4096) for m in (128, 512, 2048))
# One eager forward's GEMMs: the 7 projections of a Llama-2-7B layer (q, k, v, o, gate, up, down as (N, K)),
# repeated to 32 calls.
LLAMA2_7B_LAYER = ((4096, 4096), (4096, 4096), (4096, 4096), (4096, 4096), (11008, 4096), (11008, 4096),
                   (4096, 11008))
STACK_CALLS = 32


def _broad() -> tuple[MatmulCase, ...]:
    from .broad_shapes import broad_cases

    return tuple(MatmulCase(f"{c.cls} {c.name}", c.M, c.N, c.K) for c in broad_cases())


BROAD = _broad()
SUITES: dict[str, tuple[MatmulCase, ...]] = {
    "square": SQUARE, "llm": LLM, "prefill": PREFILL, "decode": DECODE, "unaligned": UNALIGNED,
    "epilogue": EPILOGUE, "broad": BROAD, "eager": EAGER,
}


def suite(name: str) -> tuple[MatmulCase, ...]:
    """The cases of one suite by name; ``KeyError`` naming the known suites otherwise."""
    try:
        return SUITES[name]
    except KeyError:
        raise KeyError(f"no matmul suite {name!r}; known: {', '.join(SUITES)}") from None
