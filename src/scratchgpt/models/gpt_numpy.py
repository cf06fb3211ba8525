"""The GPT forward pass in plain NumPy: the readable specification of models/gpt.py.

Every step of the architecture is one small function on arrays; there is no cache, batching,
dropout or training. ``params`` is our GPT's ``state_dict`` as NumPy arrays (see
:func:`params_from_torch`) and ``cfg`` its config as a dict (``GPTConfig.to_dict()``), so both
implementations run the same weights and a test checks they give the same logits, for every
architecture option. Shapes: T = sequence length, C = n_embd, D = head width, V = vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

Params = dict[str, np.ndarray]
Config = Mapping[str, Any]  # GPTConfig's fields


def gelu(x: np.ndarray) -> np.ndarray:
    """GPT-2's GELU, the tanh approximation."""
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def gelu_exact(x: np.ndarray) -> np.ndarray:
    """The exact GELU, x * Phi(x), with Phi the standard normal CDF."""
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


def relu2(x: np.ndarray) -> np.ndarray:
    """relu(x)^2, the speedrun's activation."""
    return relu(x) ** 2


ACTIVATIONS = {"gelu_tanh": gelu, "gelu": gelu_exact, "relu": relu, "relu2": relu2}


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis (shifted by the max for numerical safety)."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """Normalize each row to mean 0, variance 1, then scale and shift. x: (T, C)."""
    mean, var = x.mean(axis=-1, keepdims=True), x.var(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Scale each row to root-mean-square 1, then by the gain w. x: (T, D)."""
    return x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + eps) * w


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """x @ w^T + b, with w stored (out, in) as in torch's nn.Linear."""
    return x @ w.T + (0 if b is None else b)


def sinusoids(T: int, C: int) -> np.ndarray:
    """The fixed position table of "Attention Is All You Need": row t holds sin(t * f_i) in
    the even and cos(t * f_i) in the odd columns, f_i = 10000^(-2i / C). -> (T, C)"""
    angles = np.arange(T)[:, None] * 10000.0 ** (-np.arange(0, C, 2) / C)  # (T, C/2)
    table = np.zeros((T, C))
    table[:, 0::2], table[:, 1::2] = np.sin(angles), np.cos(angles[:, : C // 2])
    return table


def rope(x: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """Rotary positions: turn each pair (x[t, i], x[t, i + D/2]) by t * base^(-2i / D).
    x: (T, D) -> (T, D)"""
    T, D = x.shape
    angles = np.arange(T)[:, None] * base ** (-np.arange(0, D, 2) / D)  # (T, D/2)
    cos, sin = np.cos(angles), np.sin(angles)
    x1, x2 = x[:, : D // 2], x[:, D // 2:]  # 2 x (T, D/2)
    return np.hstack([x1 * cos - x2 * sin, x1 * sin + x2 * cos])


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Causal scaled dot-product attention. q, k, v: (T, D) -> (T, D)."""
    T = q.shape[0]
    future = np.triu(np.ones((T, T), dtype=bool), k=1)  # True where the key is in the future
    scores = q @ k.T / np.sqrt(q.shape[-1])  # (T, T)
    return softmax(np.where(future, -np.inf, scores)) @ v


def mha(x: np.ndarray, p: Params, prefix: str, cfg: Config,
        ve: np.ndarray | None = None) -> np.ndarray:
    """Multi-head causal self-attention. x: (T, C), ve: the layer's value embedding (T, C) or
    None -> (T, C)."""
    qkv = linear(x, p[f"{prefix}.c_attn.weight"], p.get(f"{prefix}.c_attn.bias"))  # (T, 3C)
    q, k, v = np.split(qkv, 3, axis=-1)  # 3 x (T, C)
    if ve is not None:  # mix the token's value embedding into its values
        lam = p[f"{prefix}.ve_lambda"]  # a learned scalar
        v = (1 - lam) * v + lam * ve  # (T, C)
    heads = []
    for qh, kh, vh in zip(*(np.split(a, cfg["n_head"], axis=-1) for a in (q, k, v)),
                          strict=True):  # each (T, D)
        if cfg["qk_norm"]:
            qh = rms_norm(qh, p[f"{prefix}.q_norm.weight"], cfg["layer_norm_eps"])
            kh = rms_norm(kh, p[f"{prefix}.k_norm.weight"], cfg["layer_norm_eps"])
        if cfg["pos_encoding"] == "rope":
            qh, kh = rope(qh), rope(kh)
        heads.append(attention(qh, kh, vh))  # (T, D)
    return linear(np.hstack(heads), p[f"{prefix}.c_proj.weight"], p.get(f"{prefix}.c_proj.bias"))


def ffn(x: np.ndarray, p: Params, prefix: str, activation: str = "gelu_tanh") -> np.ndarray:
    """Position-wise feed-forward: C -> 4C -> activation -> C. x: (T, C)."""
    h = linear(x, p[f"{prefix}.c_fc.weight"], p.get(f"{prefix}.c_fc.bias"))  # (T, 4C)
    h = ACTIVATIONS[activation](h)
    return linear(h, p[f"{prefix}.c_proj.weight"], p.get(f"{prefix}.c_proj.bias"))


def norm(x: np.ndarray, p: Params, name: str, cfg: Config) -> np.ndarray:
    """The LayerNorm ``name`` applied to x (T, C), or x itself in a model without LayerNorms."""
    if not cfg["layernorm"]:
        return x
    return layer_norm(x, p[f"{name}.weight"], p.get(f"{name}.bias", 0), cfg["layer_norm_eps"])


def transformer_block(x: np.ndarray, p: Params, prefix: str, cfg: Config,
                      ve: np.ndarray | None = None) -> np.ndarray:
    """Pre-LayerNorm block: x + mha(ln_1(x)), then + ffn(ln_2(x)). x: (T, C).

    Without residuals each sublayer's output replaces x; without an MLP there is no ffn."""
    a = mha(norm(x, p, f"{prefix}.ln_1", cfg), p, f"{prefix}.attn", cfg, ve)  # (T, C)
    x = x + a if cfg["residual"] else a
    if not cfg["mlp"]:
        return x
    m = ffn(norm(x, p, f"{prefix}.ln_2", cfg), p, f"{prefix}.mlp", cfg["activation"])  # (T, C)
    return x + m if cfg["residual"] else m


def embed(ids: np.ndarray, p: Params, cfg: Config) -> np.ndarray:
    """Token embeddings plus position embeddings (none with RoPE). ids: (T,) -> (T, C)."""
    x = p["transformer.wte.weight"][ids]  # (T, C)
    if cfg["pos_encoding"] == "learned":
        return x + p["transformer.wpe.weight"][: len(ids)]
    if cfg["pos_encoding"] == "sinusoidal":
        return x + sinusoids(*x.shape)
    return x


def value_embedding(ids: np.ndarray, p: Params, cfg: Config, i: int) -> np.ndarray | None:
    """Layer i's value embedding of the tokens (T, C): with N tables, the first N layers use
    tables 0..N-1 and the last N layers use them again in the same order; else None."""
    n, n_layer = cfg["value_embeds"], cfg["n_layer"]
    table = i if i < n else i - (n_layer - n) if i >= n_layer - n else None
    return None if table is None else p[f"transformer.ve.{table}.weight"][ids]


def gpt(ids: np.ndarray, p: Params, cfg: Config) -> np.ndarray:
    """Token ids (T,) -> logits (T, V)."""
    n_layer = cfg["n_layer"]
    n_skip = n_layer // 2 if cfg["unet_skips"] else 0  # U-net: first n_skip -> last n_skip
    x, saved = embed(ids, p, cfg), []  # (T, C); saved: outputs of the first n_skip blocks
    for i in range(n_layer):
        if i >= n_layer - n_skip:  # the block mirroring this one: the last saved
            x = x + p["skip_weights"][i - (n_layer - n_skip)] * saved.pop()
        x = transformer_block(x, p, f"transformer.h.{i}", cfg, value_embedding(ids, p, cfg, i))
        if i < n_skip:
            saved.append(x)
    logits = norm(x, p, "transformer.ln_f", cfg) @ p["lm_head.weight"].T  # (T, V)
    cap = cfg["logit_softcap"]
    return cap * np.tanh(logits / cap) if cap else logits


def params_from_torch(state_dict: dict) -> Params:
    """Our GPT's state_dict (torch tensors) -> float64 NumPy arrays with the same names."""
    return {k: v.detach().cpu().double().numpy() for k, v in state_dict.items()}
