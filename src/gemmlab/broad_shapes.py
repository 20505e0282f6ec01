"""The broad shape set (issue 14): GEMM shapes from real model dimensions of many families, at token
counts from single-token decode to long prefill, aligned and not, each tagged with its class.

Every case is an nn.Linear-style product in the TN layout (``x`` (M, K) @ ``w.t()``, ``w`` (N, K)): M
tokens, N output features, K input features. The projections are those of the models' published configs
(hidden size, intermediate size, query / key-value heads x head size): fused QKV (q + 2 kv heads), the
attention output, fused gate+up (SwiGLU / GeGLU, 2 x intermediate) or a plain MLP up, and down. Which
token counts go with which projection is drawn with a seeded generator (``SEED``), so the set is the same
on every machine; ``benchmarks/shapes/broad.json`` is this list written out by
``python -m gemmlab.broad_shapes --out benchmarks/shapes/broad.json`` (a test checks they agree).

Classes (``BroadCase.cls``): ``decode`` (M <= 32), ``mid`` (M 33 .. 3999), ``prefill`` (M >= 4000),
``square`` (M = N = K), ``unaligned`` (N or K not a multiple of 8: a row is not 16-byte aligned, the
shapes where cuBLAS leaves its fast path). Pure data: no torch, no GPU.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import asdict, dataclass

SEED = 14  # issue 14

# family -> model -> (hidden, intermediate, q heads, kv heads, head dim, gated MLP, fused projections)
MODELS: dict[str, dict[str, tuple]] = {
    "llama": {"llama2-7b": (4096, 11008, 32, 32, 128, True, True), "llama2-13b": (5120, 13824, 40, 40, 128, True, True),
              "llama3-8b": (4096, 14336, 32, 8, 128, True, True), "llama3-70b": (8192, 28672, 64, 8, 128, True, True),
              "llama3-405b": (16384, 53248, 128, 8, 128, True, True), "llama3.2-1b": (2048, 8192, 32, 8, 64, True, False),
              "llama3.2-3b": (3072, 8192, 24, 8, 128, True, False)},
    "mistral": {"mistral-7b": (4096, 14336, 32, 8, 128, True, False), "mixtral-8x22b": (6144, 16384, 48, 8, 128, True, True),
                "mistral-nemo-12b": (5120, 14336, 32, 8, 128, True, True),
                "mistral-small-24b": (5120, 32768, 32, 8, 128, True, False)},
    "qwen": {"qwen2-0.5b": (896, 4864, 14, 2, 64, True, True), "qwen2-1.5b": (1536, 8960, 12, 2, 128, True, True),
             "qwen2-7b": (3584, 18944, 28, 4, 128, True, True), "qwen2-72b": (8192, 29568, 64, 8, 128, True, True),
             "qwen2.5-3b": (2048, 11008, 16, 2, 128, True, False), "qwen2.5-14b": (5120, 13824, 40, 8, 128, True, True),
             "qwen2.5-32b": (5120, 27648, 40, 8, 128, True, False), "qwen3-0.6b": (1024, 3072, 16, 8, 128, True, True),
             "qwen3-4b": (2560, 9728, 32, 8, 128, True, False), "qwen3-8b": (4096, 12288, 32, 8, 128, True, True),
             "qwen3-14b": (5120, 17408, 40, 8, 128, True, False), "qwen3-32b": (5120, 25600, 64, 8, 128, True, True)},
    "gemma": {"gemma2-2b": (2304, 9216, 8, 4, 256, True, True), "gemma2-9b": (3584, 14336, 16, 8, 256, True, False),
              "gemma2-27b": (4608, 36864, 32, 16, 128, True, True), "gemma3-1b": (1152, 6912, 4, 1, 256, True, False),
              "gemma3-4b": (2560, 10240, 8, 4, 256, True, True), "gemma3-12b": (3840, 15360, 16, 8, 256, True, False),
              "gemma3-27b": (5376, 21504, 32, 16, 128, True, True)},
    "phi": {"phi3-mini": (3072, 8192, 32, 32, 96, True, True), "phi3-medium": (5120, 17920, 40, 10, 128, True, True),
            "phi4": (5120, 17920, 40, 10, 128, True, False)},
    "deepseek": {"deepseek-v2-dense": (5120, 12288, 128, 128, 128, True, False),
                 "deepseek-v3-dense": (7168, 18432, 128, 128, 128, True, False)},
    "gpt": {"gpt2": (768, 3072, 12, 12, 64, False, True), "gpt2-medium": (1024, 4096, 16, 16, 64, False, True),
            "gpt2-xl": (1600, 6400, 25, 25, 64, False, True), "gpt-neox-20b": (6144, 24576, 64, 64, 96, False, True),
            "pythia-6.9b": (4096, 16384, 32, 32, 128, False, True), "falcon-7b": (4544, 18176, 71, 1, 64, False, True),
            "falcon-40b": (8192, 32768, 128, 8, 64, False, True)},
    "encoder": {"bert-base": (768, 3072, 12, 12, 64, False, False), "bert-large": (1024, 4096, 16, 16, 64, False, False),
                "t5-3b": (1024, 16384, 32, 32, 128, False, False), "vit-h14": (1280, 5120, 16, 16, 80, False, True),
                "vit-g14": (1408, 6144, 16, 16, 88, False, True)},
}
# DeepSeek's multi-head latent attention, (N, K) per projection (V3: q_lora 1536, kv_lora 512, 128 heads of
# 128 + 64 rope / 128 v; V2 the same at hidden 5120).
MLA = {"deepseek-v3": {"q_a": (1536, 7168), "q_b": (24576, 1536), "kv_a": (576, 7168), "kv_b": (32768, 512),
                       "o": (7168, 16384)},
       "deepseek-v2": {"q_b": (24576, 1536), "kv_a": (576, 5120), "o": (5120, 16384)}}
# Vocabulary heads (N = vocab): decode / short prefill only (they are huge).
LM_HEADS = {"gpt2": (50257, 768), "llama2-7b": (32000, 4096), "llama3-8b": (128256, 4096), "qwen2-7b": (152064, 3584)}

DECODE_M = (1, 2, 4, 8, 16, 32)
MID_M = (64, 77, 128, 200, 256, 300, 512, 640, 1000, 1024, 1536, 2040, 2048, 3000)
PREFILL_M = (4096, 5000, 8192, 16384)
# Encoder token counts: batch x sequence (BERT 128 / 384 tokens, ViT 197 / 257 / 577 with the class token).
ENCODER_M = (16 * 128, 8 * 384, 32 * 197, 64 * 197, 32 * 257, 16 * 577)
SQUARES = (1024, 2048, 3072, 4096, 5120, 6144, 8192, 1000, 2050, 3000, 4095, 6000)
RAGGED = ((4095, 4096, 4096), (4096, 4095, 4096), (2050, 3000, 1000), (1000, 1000, 1000), (77, 50257, 768),
          (300, 2050, 4095), (5000, 2050, 2050), (3000, 5000, 1000), (2040, 3584, 3584), (1023, 4097, 1025),
          (16, 4095, 4095), (1, 11007, 4096), (128, 1000, 4093), (640, 3001, 2047), (2048, 1021, 8191),
          (8192, 8191, 1000), (1000, 4096, 3005), (3, 7, 1000), (33, 257, 129), (4097, 513, 12289))
MAX_FLOP = 4.5e12  # keeps one launch under ~7 ms on an H200, so the whole set times in minutes


@dataclass(frozen=True)
class BroadCase:
    name: str
    M: int
    N: int
    K: int
    cls: str  # decode / mid / prefill / square / unaligned
    family: str
    source: str  # model and projection, or "square", "ragged"

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.M, self.N, self.K)

    @property
    def aligned(self) -> bool:
        return self.N % 8 == 0 and self.K % 8 == 0


def classify(M: int, N: int, K: int, square: bool = False) -> str:
    if N % 8 or K % 8:
        return "unaligned"
    if square:
        return "square"
    return "decode" if M <= 32 else ("mid" if M < 4000 else "prefill")


def projections(hidden: int, inter: int, qh: int, kvh: int, hd: int, gated: bool, fused: bool) -> dict:
    """(N, K) of a decoder block's GEMMs."""
    q, kv = qh * hd, kvh * hd
    out = {"o": (hidden, q), "down": (hidden, inter)}
    if fused:
        out["qkv"] = (q + 2 * kv, hidden)
        out["gate_up" if gated else "up"] = ((2 if gated else 1) * inter, hidden)
    else:
        out["q"] = (q, hidden)
        out["kv"] = (kv, hidden)
        out["gate" if gated else "up"] = (inter, hidden)
    return out


def broad_cases() -> tuple[BroadCase, ...]:
    rng = random.Random(SEED)
    out: dict[tuple[int, int, int], BroadCase] = {}

    def add(M, N, K, family, source, square=False):
        if (M, N, K) not in out and 2.0 * M * N * K <= MAX_FLOP:
            cls = classify(M, N, K, square)
            out[(M, N, K)] = BroadCase(f"{source} M={M}", M, N, K, cls, family, source)

    for family, models in MODELS.items():
        for model, dims in models.items():
            for proj, (N, K) in projections(*dims).items():
                if family == "deepseek" and proj not in ("gate", "down"):
                    continue  # its attention is MLA (below); the dense blocks' MLP is a plain SwiGLU
                src = f"{model}.{proj}"
                if family == "encoder":
                    add(rng.choice(ENCODER_M), N, K, family, src)
                    continue
                # One token count per GEMM from a class drawn at random, a second (another class) for
                # every third GEMM: all classes appear for every family without timing every pair.
                classes = rng.sample((DECODE_M, MID_M, MID_M, PREFILL_M), 2)
                add(rng.choice(classes[0]), N, K, family, src)
                if rng.random() < 1 / 3:
                    add(rng.choice(classes[1]), N, K, family, src)
    for model, projs in MLA.items():
        for proj, (N, K) in projs.items():
            add(rng.choice(DECODE_M), N, K, "deepseek", f"{model}.mla_{proj}")
            add(rng.choice(MID_M + PREFILL_M), N, K, "deepseek", f"{model}.mla_{proj}")
    for model, (N, K) in LM_HEADS.items():
        add(rng.choice(DECODE_M), N, K, "lm_head", f"{model}.lm_head")
        add(rng.choice((77, 128, 256, 512)), N, K, "lm_head", f"{model}.lm_head")
    for n in SQUARES:
        add(n, n, n, "square", "square", square=True)
    for M, N, K in RAGGED:
        add(M, N, K, "ragged", "ragged")
    return tuple(sorted(out.values(), key=lambda c: (c.cls, c.family, c.source, c.M)))


def to_json(cases) -> str:
    return json.dumps({"seed": SEED, "cases": [asdict(c) for c in cases]}, indent=1) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="write the broad shape set as JSON")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    with open(args.out, "w") as f:
        f.write(to_json(broad_cases()))


if __name__ == "__main__":
    main()
