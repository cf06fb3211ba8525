"""Generate with the NumPy forward pass (:mod:`scratchgpt.models.gpt_numpy`) instead of torch.

:class:`NumpyGPT` puts a GPT checkpoint's weights behind the interface the decode loop drives
(``model(idx, cache=...)``, ``new_cache``), so ``sample --engine numpy`` runs stream, batches,
beam search and speculative decoding unchanged, picoGPT style: its cache,
:class:`TokenCache`, remembers only the tokens, and every call runs the whole window again
through the plain NumPy functions (no KV cache: slow, and every line is the readable
specification). Same weights, same greedy text as the torch engine (tested)::

    model, _ = load_model("runs/shakespeare")
    engine = NumpyGPT(model)
    out = generate(engine, prompt, 50, SamplingConfig(temperature=0))
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from scratchgpt.errors import ConfigError, GenerationError
from scratchgpt.models.gpt import GPT, GPTConfig
from scratchgpt.models.gpt_numpy import gpt, params_from_torch


class TokenCache:
    """A :class:`~scratchgpt.models.cache.DecodeCache` holding the tokens fed so far, per row;
    the forward pass recomputes from them."""

    rewinds = True

    def __init__(self, batch_size: int, max_len: int):
        self.max_len, self.pos = max_len, 0
        self.tokens = np.zeros((batch_size, max_len), dtype=np.int64)  # slot -> token id
        self.n_pad = np.zeros(batch_size, dtype=np.int64)  # leading padding slots per row

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    def rollback(self, pos: int) -> None:
        if not 0 <= pos <= self.pos:
            raise ValueError(f"cannot roll back to {pos}: cache holds {self.pos} positions")
        self.pos = pos

    def select_rows(self, rows: Tensor) -> None:
        self.tokens, self.n_pad = self.tokens[rows.numpy()], self.n_pad[rows.numpy()]

    def left_pad(self, n_pad: Tensor | None) -> None:
        self.n_pad = np.zeros(self.batch_size, np.int64) if n_pad is None else n_pad.numpy()


class NumpyGPT:
    """A GPT checkpoint run by :func:`scratchgpt.models.gpt_numpy.gpt` (float64).

    Refuses a model whose NumPy logits differ from the torch ones on a probe sequence (an
    architecture option the NumPy specification does not implement)."""

    def __init__(self, model: GPT):
        if not isinstance(model, GPT):
            raise ConfigError("the NumPy engine runs GPT checkpoints only")
        self.config: GPTConfig = model.config
        self.params = params_from_torch(model.state_dict())
        self._check_against(model)

    def _check_against(self, model: GPT) -> None:
        cfg = self.config
        probe = torch.arange(min(8, cfg.block_size)) % cfg.vocab_size  # (T,)
        try:
            ours = self._logits(probe.numpy())
        except (KeyError, ValueError) as e:
            raise ConfigError(f"the NumPy engine cannot run this GPT ({e})") from None
        with torch.no_grad():
            ref = model(probe[None])[0].double().numpy()
        if not np.allclose(ours, ref, atol=1e-3, rtol=1e-3):
            raise ConfigError("the NumPy engine does not implement this GPT's architecture "
                              f"(pos_encoding {cfg.pos_encoding!r}, ...): its logits differ "
                              "from torch's")

    def _logits(self, ids: np.ndarray) -> np.ndarray:
        """One sequence (T,) -> logits (T, V)."""
        cfg = self.config
        return gpt(ids, self.params, cfg.to_dict())

    def eval(self) -> NumpyGPT:
        return self

    def new_cache(self, batch_size: int, max_len: int | None = None,
                  dtype: torch.dtype | None = None) -> TokenCache:
        max_len = max_len or self.config.block_size
        if max_len > self.config.block_size:
            raise GenerationError(f"cache length {max_len} exceeds the model's block_size "
                                  f"{self.config.block_size}")
        return TokenCache(batch_size, max_len)

    def __call__(self, idx: Tensor, cache: TokenCache | None = None,
                 last_only: bool = False) -> Tensor:
        """idx (B, T) -> logits (B, T, V) float64 ((B, 1, V) with ``last_only``); with
        ``cache``, idx continues its rows."""
        B, T = idx.shape
        if cache is None:
            cache = self.new_cache(B, T)
        if cache.pos + T > cache.max_len:
            raise GenerationError(f"sequence of {cache.pos + T} tokens exceeds the context of "
                                  f"{cache.max_len} positions")
        end = cache.pos + T
        cache.tokens[:, cache.pos:end] = idx.numpy()
        out = np.zeros((B, T, self.config.vocab_size))
        for b in range(B):  # each row alone, from its first real token (position 0)
            first = int(cache.n_pad[b])
            if first < end:
                logits = self._logits(cache.tokens[b, first:end])  # (end - first, V)
                n = min(T, end - first)
                out[b, T - n:] = logits[-n:]
        cache.pos = end
        return torch.from_numpy(out[:, -1:] if last_only else out)
