"""Recurrent networks written from their equations: Elman RNN, LSTM and GRU.

One set of weights, two execution paths. :class:`Recurrent` holds a ``torch.nn.RNN``/``LSTM``/
``GRU`` module purely as the owner of the parameters (``weight_ih_l{k}``, ``weight_hh_l{k}``,
``bias_ih_l{k}``, ``bias_hh_l{k}``, the exact layout PyTorch uses, so weights copy 1:1), and

* ``fast=False`` runs the cells below, one time step at a time, in plain tensor code;
* ``fast=True`` calls the torch module (its fused C++ kernel) on the same parameters.

The tests check that both paths agree to 1e-5. A language model picks its path with
``RecurrentConfig.cells`` (``scratchgpt train --model lstm --cells scratch``), and
``scratchgpt bench recurrent`` times the two. The cell equations, for input ``x`` and previous
hidden state ``h`` (``W_i*`` act on ``x``, ``W_h*`` on ``h``, each with its own bias):

* RNN:  ``h' = tanh(W_ih x + b_ih + W_hh h + b_hh)``
* LSTM: ``i, f, g, o = split(W_ih x + b_ih + W_hh h + b_hh)`` (in that order),
  ``c' = sigmoid(f) * c + sigmoid(i) * tanh(g)``, ``h' = sigmoid(o) * tanh(c')``
* GRU:  ``r, z = sigmoid(split(W_i[rz] x + b_i[rz] + W_h[rz] h + b_h[rz]))``,
  ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``, ``h' = (1 - z) * n + z * h``

:class:`RecurrentLM` puts an embedding in front and a linear head behind: a character-level
language model with a hidden state that sampling carries forward in a :class:`RecurrentState`.
Registered as model types ``rnn``, ``lstm`` and ``gru`` (see :func:`cell_config`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scratchgpt.models.configs.rnn import (
    CELLS,
    RecurrentClassifierConfig,
    RecurrentConfig,
)
from scratchgpt.models.dropout import Dropout, dropout

# h for rnn/gru, (h, c) for lstm; each of shape [num_layers, batch, hidden] like torch.
HiddenState = Tensor | tuple[Tensor, Tensor]


# ---------------------------------------------------------------------------------------------
# Cells: one time step. `xw` is the input projection W_ih x + b_ih, precomputed for all steps.
# ---------------------------------------------------------------------------------------------


def rnn_cell(xw: Tensor, h: Tensor, w_hh: Tensor, b_hh: Tensor) -> Tensor:
    """Elman step: ``h' = tanh(xw + W_hh h + b_hh)``. Shapes: xw, h [B, H]."""
    return torch.tanh(xw + F.linear(h, w_hh, b_hh))


def lstm_cell(
    xw: Tensor, h: Tensor, c: Tensor, w_hh: Tensor, b_hh: Tensor
) -> tuple[Tensor, Tensor]:
    """LSTM step with fused gates in PyTorch's order i, f, g, o. xw: [B, 4H]; h, c: [B, H]."""
    gates = xw + F.linear(h, w_hh, b_hh)  # [B, 4H]
    i, f, g, o = gates.chunk(4, dim=-1)  # 4 x [B, H]
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    return h, c


def gru_cell(xw: Tensor, h: Tensor, w_hh: Tensor, b_hh: Tensor) -> Tensor:
    """GRU step in PyTorch's order r, z, n. xw: [B, 3H]; h: [B, H].

    Note the reset gate multiplies ``W_hn h + b_hn`` (bias included), as in PyTorch/cuDNN.
    """
    hw = F.linear(h, w_hh, b_hh)  # [B, 3H]
    x_r, x_z, x_n = xw.chunk(3, dim=-1)
    h_r, h_z, h_n = hw.chunk(3, dim=-1)
    r = torch.sigmoid(x_r + h_r)
    z = torch.sigmoid(x_z + h_z)
    n = torch.tanh(x_n + r * h_n)
    return (1 - z) * n + z * h


_TORCH_MODULES = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}


class Recurrent(nn.Module):
    """A stack of ``num_layers`` recurrent layers, batch first, dropout between layers.

    ``forward(x [B, T, input_size], state=None) -> (out [B, T, hidden], state)`` where ``state`` is
    ``h`` (rnn/gru) or ``(h, c)`` (lstm), each ``[num_layers, B, hidden]``; pass the returned state
    back in to continue a sequence across calls.
    """

    def __init__(
        self,
        cell: str,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        dropout: float = 0.0,
        fast: bool = True,
    ):
        super().__init__()
        if cell not in CELLS:
            raise ValueError(f"cell must be one of {CELLS}, got {cell!r}")
        self.cell = cell
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.dropout = dropout
        self.fast = fast
        # The torch module owns the parameters; `fast=False` reads them in `_scratch_forward`.
        self.core = _TORCH_MODULES[cell](
            input_size, hidden_size, num_layers, batch_first=True,
            dropout=dropout if num_layers > 1 else 0.0,
        )

    def init_forget_bias(self, value: float = 1.0) -> None:
        """LSTM only: start every forget gate at ``sigmoid(value)`` (``b_if = value``, ``b_hf = 0``)
        so the cell keeps its memory by default early in training (Jozefowicz et al., 2015)."""
        if self.cell != "lstm":
            raise ValueError("forget-gate bias only exists in an LSTM")
        h = self.hidden_size
        with torch.no_grad():
            for k in range(self.num_layers):
                _, _, b_ih, b_hh = self.layer_weights(k)
                b_ih[h : 2 * h] = value  # gate order i, f, g, o: f is the second block
                b_hh[h : 2 * h] = 0.0

    def layer_weights(self, k: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(weight_ih, weight_hh, bias_ih, bias_hh) of layer ``k``."""
        core = self.core
        return (getattr(core, f"weight_ih_l{k}"), getattr(core, f"weight_hh_l{k}"),
                getattr(core, f"bias_ih_l{k}"), getattr(core, f"bias_hh_l{k}"))

    def zero_state(self, batch_size: int, device: Any = None, dtype: Any = None) -> HiddenState:
        """The all-zeros initial state for ``batch_size`` sequences."""
        p = self.core.weight_hh_l0
        h = torch.zeros(self.num_layers, batch_size, self.hidden_size,
                        device=device or p.device, dtype=dtype or p.dtype)
        return (h, h.clone()) if self.cell == "lstm" else h

    def forward(self, x: Tensor, state: HiddenState | None = None) -> tuple[Tensor, HiddenState]:
        if state is None:
            state = self.zero_state(x.size(0), x.device, x.dtype)
        if self.fast:
            return self.core(x, state)
        return self._scratch_forward(x, state)

    def _scratch_forward(self, x: Tensor, state: HiddenState) -> tuple[Tensor, HiddenState]:
        if self.cell == "lstm":
            h0, c0 = state
        else:
            h0, c0 = state, None
        final_h, final_c = [], []
        layer_in = x  # [B, T, D]
        for k in range(self.num_layers):
            w_ih, w_hh, b_ih, b_hh = self.layer_weights(k)
            # The input projection does not depend on h: do it for all T steps in one matmul.
            xw = F.linear(layer_in, w_ih, b_ih)  # [B, T, G*H], G = 1 (rnn), 4 (lstm), 3 (gru)
            h = h0[k]  # [B, H]
            c = c0[k] if c0 is not None else None
            outs = []
            for t in range(x.size(1)):
                if self.cell == "lstm":
                    h, c = lstm_cell(xw[:, t], h, c, w_hh, b_hh)
                elif self.cell == "gru":
                    h = gru_cell(xw[:, t], h, w_hh, b_hh)
                else:
                    h = rnn_cell(xw[:, t], h, w_hh, b_hh)
                outs.append(h)
            final_h.append(h)
            final_c.append(c)
            layer_in = torch.stack(outs, dim=1)  # [B, T, H]
            if k < self.num_layers - 1 and self.dropout > 0:
                layer_in = dropout(layer_in, self.dropout, self.training)
        h_n = torch.stack(final_h)  # [L, B, H]
        if self.cell == "lstm":
            return layer_in, (h_n, torch.stack(final_c))
        return layer_in, h_n


# ---------------------------------------------------------------------------------------------
# Recurrent language model
# ---------------------------------------------------------------------------------------------


@dataclass
class RecurrentState:
    """The hidden state a :class:`RecurrentLM` carries between calls, updated in place (a
    :class:`~scratchgpt.models.cache.DecodeCache`).

    ``h`` (and ``c`` for the LSTM) have shape ``[n_layer, batch, hidden]``; ``pos`` counts the
    positions fed so far (the generation loop reads it, as it reads a KV cache's ``pos``).
    ``n_pad`` (one count per row, or None) marks each row's first positions as left padding:
    the state of row ``b`` ignores its first ``n_pad[b]`` positions (see :meth:`advance`), so
    prompts of different lengths share a batch and each row computes what it would alone.
    """

    h: Tensor
    c: Tensor | None = None
    pos: int = 0
    n_pad: list[int] | None = None

    max_len: ClassVar[None] = None  # the state has the same size however long the sequence
    rewinds: ClassVar[bool] = False  # a state cannot forget its last tokens; see rollback

    @property
    def batch_size(self) -> int:
        return self.h.size(1)

    def as_hidden(self) -> HiddenState:
        return (self.h, self.c) if self.c is not None else self.h

    def update(self, hidden: HiddenState) -> None:
        if isinstance(hidden, tuple):
            self.h, self.c = hidden
        else:
            self.h = hidden

    def detach(self) -> None:
        """Cut the autograd history (truncated backpropagation through time between batches)."""
        self.h = self.h.detach()
        if self.c is not None:
            self.c = self.c.detach()

    def rollback(self, pos: int) -> None:
        """Go back to ``pos`` tokens. Only 0 (reset to zeros) and the current position are
        possible: a hidden state cannot forget its last tokens without storing old states."""
        if pos == self.pos:
            return
        if pos != 0:
            raise ValueError(f"a recurrent state cannot roll back from {self.pos} to {pos} "
                             f"tokens (only to 0); feed the sequence again from a new state")
        self.h = torch.zeros_like(self.h)
        self.c = torch.zeros_like(self.c) if self.c is not None else None
        self.pos = 0

    def select_rows(self, rows: Tensor) -> None:
        """Row ``i`` becomes a copy of row ``rows[i]`` (beam search keeps the best beams, a batch
        drops finished rows)."""
        self.h = self.h[:, rows]
        if self.c is not None:
            self.c = self.c[:, rows]
        if self.n_pad is not None:
            self.n_pad = [self.n_pad[r] for r in rows.tolist()]

    def left_pad(self, n_pad: Tensor | None) -> None:
        """Row ``b``'s first ``n_pad[b]`` positions are padding (call on an empty state)."""
        self.n_pad = None if n_pad is None or not bool(n_pad.any()) else n_pad.tolist()

    def pad_counts(self) -> Tensor:
        """Padding positions at the front of each row, (B,) int64."""
        return torch.tensor(self.n_pad or [0] * self.batch_size, dtype=torch.long)

    def append_rows(self, other: RecurrentState) -> None:
        """Add ``other``'s rows (a state has no slots: only the padding counts move so that
        both sides continue at position ``max(self.pos, other.pos)``)."""
        pos = max(self.pos, other.pos)
        pads = torch.cat([self.pad_counts() + pos - self.pos, other.pad_counts() + pos - other.pos])
        self.h = torch.cat([self.h, other.h], dim=1)
        if self.c is not None:
            self.c = torch.cat([self.c, other.c], dim=1)
        self.pos = pos
        self.left_pad(pads)

    def trim(self, n: int) -> None:
        """Forget ``n`` leading padding positions: only the counts change."""
        pads = self.pad_counts() - n
        if bool((pads < 0).any()):
            raise ValueError(f"cannot trim {n} positions: every row must have that much padding")
        self.pos -= n
        self.left_pad(pads)

    def advance(self, rnn: Recurrent, x: Tensor) -> Tensor:
        """Run ``rnn`` over ``x`` [B, T, D] from this state and keep its final state here.

        Padding positions leave a row's state untouched (their outputs are zeros): a call that
        covers some row's padding runs each row over its real positions alone."""
        T = x.size(1)
        skip = None if self.n_pad is None else [min(T, max(0, p - self.pos)) for p in self.n_pad]
        if skip is None or not any(skip):
            out, hidden = rnn(x, self.as_hidden())
            self.update(hidden)
        else:
            out = x.new_zeros(x.size(0), T, rnn.hidden_size)
            h = self.h.clone()
            c = self.c.clone() if self.c is not None else None
            for b, s in enumerate(skip):
                if s == T:
                    continue  # only padding for this row in this call
                row_h = h[:, b:b + 1].contiguous()  # [L, 1, H]
                row = (row_h, c[:, b:b + 1].contiguous()) if c is not None else row_h
                o, hidden = rnn(x[b:b + 1, s:], row)
                out[b, s:] = o[0]
                if c is not None:
                    h[:, b], c[:, b] = hidden[0][:, 0], hidden[1][:, 0]
                else:
                    h[:, b] = hidden[:, 0]
            self.h, self.c = h, c
        self.pos += T
        return out


class RecurrentLM(nn.Module):
    """Embedding -> stacked RNN/LSTM/GRU -> linear head over the vocabulary.

    ``forward(idx [B, T], cache=None) -> logits [B, T, vocab]``, the interface every language
    model here shares. Without ``cache`` every call starts from zeros; with a
    :class:`RecurrentState` (from :meth:`new_cache`) the call starts from it and leaves the final
    hidden state in it, so generation feeds one new token per call instead of the whole prompt.
    """

    def __init__(self, config: RecurrentConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden)
        self.drop = Dropout(config.dropout)
        self.rnn = Recurrent(config.cell, config.hidden, config.hidden, config.n_layer,
                             config.dropout, fast=config.cells == "torch")
        self.head = nn.Linear(config.hidden, config.vocab_size)

    def new_cache(self, batch_size: int, max_len: int | None = None,
                  dtype: torch.dtype | None = None) -> RecurrentState:
        """Zero hidden state for ``batch_size`` sequences, on the model's device (and its dtype
        unless ``dtype`` is given). ``max_len`` is accepted for the common interface and ignored:
        the state has the same size however long the sequence grows."""
        hidden = self.rnn.zero_state(batch_size, dtype=dtype)
        return RecurrentState(*hidden) if isinstance(hidden, tuple) else RecurrentState(hidden)

    def forward(self, idx: Tensor, cache: RecurrentState | None = None,
                last_only: bool = False) -> Tensor:
        x = self.drop(self.embed(idx))  # [B, T, hidden]
        if cache is None:
            out, _ = self.rnn(x)  # from a zero state
        else:
            out = cache.advance(self.rnn, x)  # from the cached state, which it updates
        return self.head(self.drop(out[:, -1:] if last_only else out))  # [B, T or 1, vocab]

    def num_params(self, non_embedding: bool = False) -> int:
        """Number of trainable parameters (``non_embedding`` is accepted for the common
        interface; a recurrent model has no position table to leave out)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


class RecurrentClassifier(nn.Module):
    """Embed each symbol, run one recurrent layer over the sequence, classify from the last
    hidden state: ``forward(idx [B, T]) -> logits [B, n_classes]``. The memory experiment uses
    it to ask how far back the last state remembers."""

    def __init__(self, config: RecurrentClassifierConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.embed_dim)
        self.rnn = Recurrent(config.cell, config.embed_dim, config.hidden,
                             fast=config.cells == "torch")
        if config.cell == "lstm" and config.forget_bias is not None:
            self.rnn.init_forget_bias(config.forget_bias)
        self.head = nn.Linear(config.hidden, config.n_classes)

    def forward(self, idx: Tensor) -> Tensor:
        out, _ = self.rnn(self.embed(idx))  # [B, T, hidden]
        return self.head(out[:, -1])  # [B, n_classes]

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
