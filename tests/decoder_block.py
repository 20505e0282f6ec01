"""A small Llama-style decoder written with plain torch.nn (no downloads): the model that tests/test_nn.py
patches with gemmlab and benchmarks/model_step.py times.

    TinyDecoder: token embedding -> n x DecoderBlock -> RMSNorm -> lm_head (tied to the embedding)
    DecoderBlock: x + Attention(RMSNorm(x)), then h + MLP(RMSNorm(h))
    Attention: q/k/v/o projections (nn.Linear, no bias), grouped KV heads, rotary positions, causal SDPA
    MLP: SwiGLU, down(silu(gate(x)) * up(x))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Config:
    vocab: int = 256
    dim: int = 64
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 160
    layers: int = 2
    qkv_bias: bool = False  # Qwen-style q/k/v biases exercise the bias path

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rotary(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding of (batch, heads, seq, head_dim), computed in fp32."""
    seq, hd = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd)
    ang = torch.arange(seq, device=x.device, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.heads * hd, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.dim, cfg.kv_heads * hd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.dim, cfg.kv_heads * hd, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.heads * hd, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        c = self.cfg
        q = self.q_proj(x).view(B, S, c.heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, S, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, S, c.kv_heads, c.head_dim).transpose(1, 2)
        q, k = rotary(q), rotary(k)
        rep = c.heads // c.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, S, c.heads * c.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.down_proj = nn.Linear(cfg.ffn, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderBlock(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(cfg.dim), Attention(cfg)
        self.mlp_norm, self.mlp = RMSNorm(cfg.dim), MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.attn_norm(x))
        return h + self.mlp(self.mlp_norm(h))


class TinyDecoder(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        self.lm_head.weight = self.embed.weight  # tied: patching must keep one Parameter
        with torch.no_grad():
            self.embed.weight.normal_(0.0, cfg.dim ** -0.5)  # logits of order one at init

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x)
        return self.lm_head(self.norm(x))


def loss_fn(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy (logits in fp32)."""
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def build(cfg: Config, *, seed: int, device="cpu", dtype=torch.float32) -> TinyDecoder:
    """The model with random weights from ``seed`` (norm scales too, so none is all ones)."""
    torch.manual_seed(seed)
    model = TinyDecoder(cfg)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, RMSNorm):
                m.weight.uniform_(0.8, 1.2)
    return model.to(device=device, dtype=dtype)
