"""The GPT forward pass in plain NumPy: the readable specification of models/gpt.py.

Every step of the architecture is one small function on arrays; there is no cache, batching,
dropout or training. ``params`` is our GPT's ``state_dict`` as NumPy arrays (see
:func:`params_from_torch`), so both implementations run the same weights and a test checks
they give the same logits. Shapes: T = sequence length, C = n_embd, V = vocabulary size.
"""

from __future__ import annotations

import math

import numpy as np

Params = dict[str, np.ndarray]


def gelu(x: np.ndarray) -> np.ndarray:
    """GPT-2's GELU, the tanh approximation."""
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def gelu_exact(x: np.ndarray) -> np.ndarray:
    """The exact GELU, x * Phi(x), with Phi the standard normal CDF."""
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


ACTIVATIONS = {"gelu_tanh": gelu, "gelu": gelu_exact}


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis (shifted by the max for numerical safety)."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """Normalize each row to mean 0, variance 1, then scale and shift. x: (T, C)."""
    mean, var = x.mean(axis=-1, keepdims=True), x.var(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """x @ w^T + b, with w stored (out, in) as in torch's nn.Linear."""
    return x @ w.T + (0 if b is None else b)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Causal scaled dot-product attention. q, k, v: (T, D) -> (T, D)."""
    T = q.shape[0]
    future = np.triu(np.ones((T, T), dtype=bool), k=1)  # True where the key is in the future
    scores = q @ k.T / np.sqrt(q.shape[-1])  # (T, T)
    return softmax(np.where(future, -np.inf, scores)) @ v


def mha(x: np.ndarray, p: Params, prefix: str, n_head: int) -> np.ndarray:
    """Multi-head causal self-attention. x: (T, C) -> (T, C)."""
    qkv = linear(x, p[f"{prefix}.c_attn.weight"], p.get(f"{prefix}.c_attn.bias"))  # (T, 3C)
    q, k, v = np.split(qkv, 3, axis=-1)  # 3 x (T, C)
    heads = [attention(qh, kh, vh) for qh, kh, vh in  # n_head x (T, C / n_head)
             zip(*(np.split(a, n_head, axis=-1) for a in (q, k, v)), strict=True)]
    return linear(np.hstack(heads), p[f"{prefix}.c_proj.weight"], p.get(f"{prefix}.c_proj.bias"))


def ffn(x: np.ndarray, p: Params, prefix: str, activation: str = "gelu_tanh") -> np.ndarray:
    """Position-wise feed-forward: C -> 4C -> GELU -> C. x: (T, C)."""
    h = linear(x, p[f"{prefix}.c_fc.weight"], p.get(f"{prefix}.c_fc.bias"))  # (T, 4C)
    h = ACTIVATIONS[activation](h)
    return linear(h, p[f"{prefix}.c_proj.weight"], p.get(f"{prefix}.c_proj.bias"))


def transformer_block(x: np.ndarray, p: Params, prefix: str, n_head: int,
                      eps: float = 1e-5, activation: str = "gelu_tanh") -> np.ndarray:
    """Pre-LayerNorm block: x + mha(ln_1(x)), then + ffn(ln_2(x)). x: (T, C)."""
    def ln(h: np.ndarray, name: str) -> np.ndarray:
        return layer_norm(h, p[f"{prefix}.{name}.weight"], p.get(f"{prefix}.{name}.bias", 0), eps)

    x = x + mha(ln(x, "ln_1"), p, f"{prefix}.attn", n_head)
    return x + ffn(ln(x, "ln_2"), p, f"{prefix}.mlp", activation)


def gpt(ids: np.ndarray, p: Params, n_head: int, eps: float = 1e-5,
        activation: str = "gelu_tanh") -> np.ndarray:
    """Token ids (T,) -> logits (T, V), for a GPT with learned positions (GPT-2)."""
    x = p["transformer.wte.weight"][ids] + p["transformer.wpe.weight"][: len(ids)]  # (T, C)
    n_layer = 1 + max(int(k.split(".")[2]) for k in p if k.startswith("transformer.h."))
    for i in range(n_layer):
        x = transformer_block(x, p, f"transformer.h.{i}", n_head, eps, activation)
    x = layer_norm(x, p["transformer.ln_f.weight"], p.get("transformer.ln_f.bias", 0), eps)
    return x @ p["lm_head.weight"].T  # (T, V)


def params_from_torch(state_dict: dict) -> Params:
    """Our GPT's state_dict (torch tensors) -> float64 NumPy arrays with the same names."""
    return {k: v.detach().cpu().double().numpy() for k, v in state_dict.items()}
