"""Encoder-decoder models: LSTM with Bahdanau attention, plain LSTM, and Transformer.

All three share one interface (:class:`Seq2Seq`):

* ``forward(src [B, S], src_lengths [B], tgt_in [B, T]) -> logits [B, T, V]``: teacher forcing,
  ``tgt_in`` is ``<bos> y_1 .. y_{T-1}`` and the loss compares against ``y_1 .. y_{T-1} <eos>``;
* ``greedy_decode(src, src_lengths, max_len)`` and
  ``beam_decode(src, src_lengths, beam, max_len, length_penalty)``, which return, per example,
  the generated ids (ending with ``<eos>`` unless ``max_len`` was hit) and the cross-attention
  weights ``[generated, source length]`` for the alignment heatmap. Given ``out=[]``, either
  keeps there after every step what a stop now would leave (:data:`SoFar`), for a caller that
  Ctrl-C stops part-way.

Sources are right-padded with ``<pad>``; ``src_lengths`` counts the real tokens. A model decodes
through ``start`` (encode once) and ``step`` (one target token for every row), and the two search
routines here only ever call those (through ``next_token_logp``, which rules out the ids no
target holds), so they work for every architecture.

The ``lstm`` architecture is the attention LSTM with attention switched off: the decoder sees the
final encoder state only (Sutskever et al. / Cho et al.), the fixed-size bottleneck that attention
(Bahdanau et al., 2015) removes.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scratchgpt.errors import ConfigError
from scratchgpt.models.attention import MultiHeadAttention, attention_mask
from scratchgpt.models.cache import moved_rows

# the config and its helpers are data (models/configs/seq2seq.py, no torch); the model's users
# find them here too
from scratchgpt.models.configs.seq2seq import (  # noqa: F401
    ARCH_DEFAULTS,
    ARCHS,
    Seq2SeqConfig,
    default_config,
    unused_settings,
)
from scratchgpt.models.dropout import Dropout
from scratchgpt.models.positions import sinusoidal_positions
from scratchgpt.models.rnn import Recurrent

# Per-row decoding state: every tensor has the batch (or batch*beam) rows on dim 0; an int is
# the same for every row (a KV cache's count of positions fed), kept as it is by ``reorder``.
DecodeState = dict[str, Tensor | int]
# What a decode stopped part-way has, per example: (its output so far, whether that output is
# final: the one the whole decode returns). Greedy: the tokens so far, final once <eos> is
# among them. Beam: the hypothesis the search would return if it ended now, final once the
# example's search is over.
SoFar = list[tuple[list[int], bool]]


def padding_mask(lengths: Tensor, max_len: int) -> Tensor:
    """``[B, max_len]`` bool, True at padding positions (``j >= lengths[b]``)."""
    return torch.arange(max_len, device=lengths.device)[None, :] >= lengths[:, None]


def build_seq2seq(config: Seq2SeqConfig) -> Seq2Seq:
    """The model for ``config.arch``."""
    if config.arch == "transformer":
        return TransformerSeq2Seq(config)
    return LSTMSeq2Seq(config)


class Seq2Seq(nn.Module):
    """Common decoding code; subclasses implement ``forward``, ``start`` and ``step``."""

    config: Seq2SeqConfig

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor) -> Tensor:
        raise NotImplementedError

    def start(self, src: Tensor, src_lengths: Tensor) -> DecodeState:
        """Encode the sources; the returned state is ready for the first ``step``."""
        raise NotImplementedError

    def step(self, state: DecodeState, prev: Tensor) -> tuple[Tensor, Tensor]:
        """Feed the previous token ``prev [N]``; returns ``(log_probs [N, V], attn [N, S])`` and
        updates ``state`` in place."""
        raise NotImplementedError

    def next_token_logp(self, state: DecodeState, prev: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`step` as the searches read it: the ids no training target holds
        (``<pad>``, ``<bos>``, ``<unk>``) get log-probability -inf, so no output contains
        them. A model early in training can rank them first; an ``<unk>`` then showed in the
        text, and a ``<pad>`` or ``<bos>`` used up a step and vanished from it."""
        logp, attn = self.step(state, prev)  # [N, V], [N, S]
        c = self.config
        never = torch.tensor([c.pad_id, c.bos_id, c.unk_id], device=logp.device)
        return logp.index_fill(-1, never, float("-inf")), attn

    # The entries of a decode state that hold the source (the encoder's output, what is
    # projected from it once, its padding mask): a name, or a prefix that ends in ".". An
    # example's beams share its source, so :meth:`reorder_beams` leaves these; an entry left
    # off is copied with the rest (slower, never wrong).
    source_entries: tuple[str, ...] = ()

    @staticmethod
    def reorder(state: DecodeState, rows: Tensor) -> None:
        """Keep/duplicate rows of the state: row ``i`` becomes old row ``rows[i]``, any row."""
        for k, v in state.items():
            if isinstance(v, Tensor):  # (an int is every row's)
                state[k] = v.index_select(0, rows)

    def reorder_beams(self, state: DecodeState, rows: Tensor) -> None:
        """:meth:`reorder` for beam search, where every row ``i`` takes a row ``rows[i]`` of
        the same example (its beams are rows ``e*K .. e*K+K-1``). It copies only what beams
        do not share, in place: the source entries stay as they are (the same in each of an
        example's beams), and of the others only the rows that take another row's state, and
        only what :meth:`filled` holds of them. Copying every entry whole each step cost more
        than the step for a short output (the cross-attention's keys and values of every
        layer are source-long)."""
        found = moved_rows(rows)
        if found is None:
            return
        moved, taken = found
        for k, v in state.items():
            if isinstance(v, Tensor) and not self.is_source(k):
                held = self.filled(state, k, v)
                held[moved] = held[taken]

    def is_source(self, key: str) -> bool:
        """Whether state entry ``key`` is one of :attr:`source_entries`."""
        return any(key == s or (s.endswith(".") and key.startswith(s))
                   for s in self.source_entries)

    def filled(self, state: DecodeState, key: str, value: Tensor) -> Tensor:
        """The part of state entry ``key`` (``value``) that holds something: all of it, unless
        the model allocates ahead (the Transformer's self-attention slots)."""
        return value

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    @torch.no_grad()
    def greedy_decode(
        self, src: Tensor, src_lengths: Tensor, max_len: int, out: SoFar | None = None
    ) -> tuple[list[list[int]], list[Tensor]]:
        """Most likely token at each step, until ``<eos>`` or ``max_len`` tokens; ``out``: see
        :data:`SoFar`."""
        n, eos = src.size(0), self.config.eos_id
        state = self.start(src, src_lengths)
        prev = torch.full((n,), self.config.bos_id, dtype=torch.long, device=src.device)
        done = torch.zeros(n, dtype=torch.bool, device=src.device)
        tokens, attns = [], []
        for _ in range(max_len):
            logp, attn = self.next_token_logp(state, prev)
            prev = logp.argmax(dim=-1)
            tokens.append(prev)
            attns.append(attn)
            done |= prev == eos
            if out is not None:
                out[:] = _greedy_so_far(tokens, done, eos)
            if done.all():
                break
        tok = torch.stack(tokens, dim=1).tolist()  # [N, T]
        att = torch.stack(attns, dim=1).float().cpu()  # [N, T, S]
        out_tokens, out_attn = [], []
        for i in range(n):
            ids = tok[i]
            end = ids.index(eos) + 1 if eos in ids else len(ids)
            out_tokens.append(ids[:end])
            out_attn.append(att[i, :end, : int(src_lengths[i])])
        return out_tokens, out_attn

    @torch.no_grad()
    def beam_decode(
        self, src: Tensor, src_lengths: Tensor, beam: int, max_len: int,
        length_penalty: float = 1.0, out: SoFar | None = None,
    ) -> tuple[list[list[int]], list[Tensor]]:
        """Beam search. A hypothesis ends at ``<eos>``; hypotheses are ranked by
        ``sum log p / length ** length_penalty`` (0 = raw sum, 1 = mean per token).

        Each step takes the best ``2 * beam`` continuations of the live beams: an ``<eos>`` among
        the top ``beam`` closes a hypothesis, the best ``beam`` others stay live. An example
        stops once ``beam`` hypotheses have closed and none of its live beams, scored as it
        stands, beats the worst of the best ``beam`` of them (Hugging Face's rule,
        :func:`search_settled`, which the language models' beam search shares): stopped at
        ``beam`` closed alone, the unlikely endings a step's runners-up close could fill them
        while the likely beam was still writing. With ``beam=1`` this is exactly greedy
        search.
        ``out``: see :data:`SoFar`.
        """
        if beam < 1:
            raise ConfigError("beam must be >= 1")
        search = _BeamSearch(self, src, src_lengths, beam, length_penalty)
        for t in range(max_len):
            over = search.step(t)
            if out is not None:
                out[:] = search.so_far()
            if over:
                break
        return search.results(src_lengths)


def _greedy_so_far(tokens: list[Tensor], done: Tensor, eos: int) -> SoFar:
    """A greedy decode's :data:`SoFar`: each row's ``tokens`` [N] a step, to its ``<eos>``."""
    rows = torch.stack(tokens, dim=1).tolist()
    return [(ids[: ids.index(eos) + 1] if ended else ids, ended)
            for ids, ended in zip(rows, done.tolist(), strict=True)]


def search_settled(ended: Sequence[float], beam: int, best_live: float, length: int,
                   length_penalty: float) -> bool:
    """Whether a beam search is over, by Hugging Face's rule (``generate``'s default,
    ``early_stopping=False``): ``beam`` hypotheses have ended (scores ``ended``), and the worst
    of the best ``beam`` of them scores at least as well as the best live beam (summed
    log-probability ``best_live``, -inf for none) would, ended as it stands at ``length``
    tokens. Stopping as soon as ``beam`` had ended returned the unlikely endings each step's
    runners-up close while a likelier beam was still being written. Both beam searches ask it:
    seq2seq's and the language models' (:func:`~scratchgpt.generation.beam.beam_search`)."""
    if len(ended) < beam:
        return False
    worst_kept = heapq.nlargest(beam, ended)[-1]
    return worst_kept >= best_live / max(length, 1) ** length_penalty


class _BeamSearch:
    """The bookkeeping of :meth:`Seq2Seq.beam_decode` for B examples x K beams (B*K rows)."""

    def __init__(self, model: Seq2Seq, src: Tensor, src_lengths: Tensor, beam: int,
                 length_penalty: float):
        b, k, dev = src.size(0), beam, src.device
        self.model, self.b, self.k, self.penalty = model, b, k, length_penalty
        self.state = model.start(src, src_lengths)
        model.reorder(self.state, torch.arange(b, device=dev).repeat_interleave(k))  # B*K rows
        self.scores = torch.full((b, k), float("-inf"), device=dev)
        self.scores[:, 0] = 0.0  # all K rows start identical: keep one alive to avoid duplicates
        self.prev = torch.full((b * k,), model.config.bos_id, dtype=torch.long, device=dev)
        self.hist_tok = torch.zeros(b * k, 0, dtype=torch.long, device=dev)
        self.hist_att = torch.zeros(b * k, 0, src.size(1), device=dev)
        self.finished: list[list[tuple[float, Tensor, Tensor]]] = [[] for _ in range(b)]

    def step(self, t: int) -> bool:
        """Expand every live beam by one token; returns True when the search is over."""
        b, k, dev = self.b, self.k, self.scores.device
        logp, attn = self.model.next_token_logp(self.state, self.prev)  # [B*K, V], [B*K, S]
        v = logp.size(-1)
        cand = (self.scores.view(-1, 1) + logp.float()).view(b, k * v)  # [B, K*V]
        top_s, top_i = cand.topk(min(2 * k, k * v), dim=1)
        new_scores = torch.full((b, k), float("-inf"), device=dev)
        rows = torch.arange(b * k, device=dev)  # dead slots keep any valid row
        new_tok = torch.full((b, k), self.model.config.pad_id, dtype=torch.long, device=dev)
        for i in range(b):
            if not self._settled(i):
                self._choose(i, t, top_s[i], top_i[i] // v, top_i[i] % v, attn,
                             (new_scores, rows, new_tok))
        self.model.reorder_beams(self.state, rows)  # rows stay in their example
        self.hist_tok = torch.cat([self.hist_tok[rows], new_tok.view(-1, 1)], dim=1)
        self.hist_att = torch.cat([self.hist_att[rows], attn[rows].float().unsqueeze(1)], dim=1)
        self.scores, self.prev = new_scores, new_tok.view(-1)
        return (all(self._settled(i) for i in range(b))
                or bool((self.scores == float("-inf")).all()))

    def _settled(self, i: int) -> bool:
        """Example ``i`` is decided (:func:`search_settled`): ``beam`` hypotheses have
        closed, and the worst of the best ``beam`` of them scores at least as well as every
        live beam as it stands (at its present length)."""
        return search_settled([h[0] for h in self.finished[i]], self.k,
                              float(self.scores[i].max()), self.hist_tok.size(1), self.penalty)

    def _choose(self, i: int, t: int, top_s: Tensor, top_row: Tensor, top_tok: Tensor,
                attn: Tensor, out: tuple[Tensor, Tensor, Tensor]) -> None:
        """Example ``i``: close hypotheses that end in ``<eos>``, keep the best K others live.
        top_s, top_row (which live beam), top_tok: (2K,), best first."""
        new_scores, rows, new_tok = out
        k, live = self.k, 0
        for j in range(top_s.size(0)):
            s = float(top_s[j])
            if s == float("-inf") or live == k:
                break
            r, tok = i * k + int(top_row[j]), int(top_tok[j])
            if tok == self.model.config.eos_id:
                if j < k:
                    seq = torch.cat([self.hist_tok[r], top_tok[j:j + 1]])
                    att = torch.cat([self.hist_att[r], attn[r:r + 1].float()])
                    self.finished[i].append((s / (t + 1) ** self.penalty, seq, att))
                continue
            new_scores[i, live], rows[i * k + live], new_tok[i, live] = s, r, tok
            live += 1

    def results(self, src_lengths: Tensor) -> tuple[list[list[int]], list[Tensor]]:
        """The best hypothesis of each example: (token ids, attention [out, source])."""
        out_tokens, out_attn = [], []
        for i in range(self.b):
            seq, att = self._best(i)
            out_tokens.append(seq.tolist())
            out_attn.append(att[:, : int(src_lengths[i])].cpu())
        return out_tokens, out_attn

    def so_far(self) -> SoFar:
        """Each example's :meth:`results` if the search ended now, and whether it is over."""
        return [(self._best(i)[0].tolist(), self._settled(i)) for i in range(self.b)]

    def _best(self, i: int) -> tuple[Tensor, Tensor]:
        """(token ids, attention) of example ``i``'s best hypothesis: of the closed ones, and,
        while fewer than ``beam`` are (out of steps, or stopped), of the live beams too."""
        hyps = list(self.finished[i])
        length = self.hist_tok.size(1)
        if len(hyps) < self.k:  # live beams compete as they are
            for j in range(self.k):
                s = float(self.scores[i, j])
                if s > float("-inf"):
                    r = i * self.k + j
                    hyps.append((s / max(length, 1) ** self.penalty, self.hist_tok[r],
                                 self.hist_att[r]))
        _, seq, att = max(hyps, key=lambda h: h[0])
        return seq, att


# ---------------------------------------------------------------------------------------------
# LSTM encoder-decoder, with or without Bahdanau attention
# ---------------------------------------------------------------------------------------------


class AdditiveAttention(nn.Module):
    """Bahdanau attention: ``score(s, h_j) = v^T tanh(W_q s + W_k h_j)``, softmax over the
    source positions that are not padding."""

    def __init__(self, query_dim: int, key_dim: int, attn_dim: int):
        super().__init__()
        self.w_q = nn.Linear(query_dim, attn_dim, bias=False)
        self.w_k = nn.Linear(key_dim, attn_dim)
        self.v = nn.Linear(attn_dim, 1, bias=False)

    def project_keys(self, keys: Tensor) -> Tensor:
        """``W_k h_j`` for all source positions; computed once per source. [B, S, A]"""
        return self.w_k(keys)

    def forward(
        self, query: Tensor, projected_keys: Tensor, values: Tensor, pad: Tensor
    ) -> tuple[Tensor, Tensor]:
        """query [B, Q], projected_keys [B, S, A], values [B, S, D], pad [B, S] ->
        (context [B, D], weights [B, S])."""
        e = self.v(torch.tanh(self.w_q(query).unsqueeze(1) + projected_keys)).squeeze(-1)  # [B,S]
        alpha = e.masked_fill(pad, float("-inf")).softmax(dim=-1)
        context = (alpha.unsqueeze(-1) * values).sum(dim=1)  # [B, D]
        return context, alpha


class LSTMSeq2Seq(Seq2Seq):
    """LSTM encoder (optionally bidirectional) -> LSTM decoder.

    At step ``t`` the decoder reads ``[embed(y_{t-1}); c_t]`` where the context ``c_t`` is the
    attention-weighted sum of encoder outputs, queried with the previous top decoder state
    (``lstm-attention``), or always the final encoder output (``lstm``). The output layer reads
    ``[s_t; c_t; embed(y_{t-1})]`` through a tanh layer.
    """

    source_entries = ("enc", "pad", "summary", "keys")  # a decode step changes "h", "c" only

    def __init__(self, config: Seq2SeqConfig):
        super().__init__()
        self.config = config
        d, dirs = config.d_model, 2 if config.bidirectional else 1
        self.use_attention = config.arch == "lstm-attention"
        self.src_embed = nn.Embedding(config.src_vocab, d, padding_idx=config.pad_id)
        self.tgt_embed = nn.Embedding(config.tgt_vocab, d, padding_idx=config.pad_id)
        self.drop = Dropout(config.dropout)
        # The encoder runs torch's fused LSTM on packed sequences so that padding never enters
        # the recurrence (the cells themselves are written out in scratchgpt.models.rnn).
        self.encoder = nn.LSTM(d, d, config.n_layer, batch_first=True,
                               bidirectional=config.bidirectional,
                               dropout=config.dropout if config.n_layer > 1 else 0.0)
        self.bridge_h = nn.Linear(d * dirs, d)  # final encoder state -> initial decoder state
        self.bridge_c = nn.Linear(d * dirs, d)
        ctx = d * dirs
        self.attention = AdditiveAttention(d, ctx, d) if self.use_attention else None
        self.decoder = Recurrent("lstm", d + ctx, d, config.n_layer, config.dropout, fast=True)
        self.readout = nn.Linear(d + ctx + d, d)
        self.head = nn.Linear(d, config.tgt_vocab)

    def start(self, src: Tensor, src_lengths: Tensor) -> DecodeState:
        b, s = src.shape
        x = self.drop(self.src_embed(src))  # [B, S, d]
        packed = nn.utils.rnn.pack_padded_sequence(x, src_lengths.cpu(), batch_first=True,
                                                   enforce_sorted=False)
        out, (h_n, c_n) = self.encoder(packed)
        enc, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=s)
        # enc: [B, S, dirs*d]; zeros at padding
        layers, dirs = self.config.n_layer, 2 if self.config.bidirectional else 1
        # [L*dirs, B, d] -> [L, dirs, B, d] -> [L, B, dirs, d] -> [L, B, dirs*d]
        h_n = h_n.view(layers, dirs, b, -1).transpose(1, 2).reshape(layers, b, -1)
        c_n = c_n.view(layers, dirs, b, -1).transpose(1, 2).reshape(layers, b, -1)
        h0 = torch.tanh(self.bridge_h(h_n))  # [L, B, d]
        c0 = self.bridge_c(c_n)
        state = {
            "h": h0.transpose(0, 1),  # batch first for reorder: [B, L, d]
            "c": c0.transpose(0, 1),
            "enc": enc,
            "pad": padding_mask(src_lengths.to(src.device), s),
            "summary": h_n[-1],  # top layer, both directions: [B, dirs*d]
        }
        if self.attention is not None:
            state["keys"] = self.attention.project_keys(enc)  # [B, S, d]
        return state

    def _decode(self, state: DecodeState, emb: Tensor) -> tuple[Tensor, Tensor]:
        """One decoder step for embedded tokens ``emb [N, d]`` -> (pre-logits [N, d], attn)."""
        h, c = state["h"].transpose(0, 1), state["c"].transpose(0, 1)  # [L, N, d]
        if self.attention is not None:
            context, alpha = self.attention(h[-1], state["keys"], state["enc"], state["pad"])
        else:
            context = state["summary"]
            # The plain model attends nowhere; report the final source position for plots.
            last = (~state["pad"]).sum(dim=1) - 1
            alpha = F.one_hot(last, state["pad"].size(1)).to(context.dtype)
        inp = torch.cat([emb, context], dim=-1).unsqueeze(1)  # [N, 1, d + ctx]
        out, (h, c) = self.decoder(inp, (h.contiguous(), c.contiguous()))
        state["h"], state["c"] = h.transpose(0, 1), c.transpose(0, 1)
        s_t = out.squeeze(1)  # [N, d]
        pre = torch.tanh(self.readout(torch.cat([s_t, context, emb], dim=-1)))
        return self.drop(pre), alpha

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor) -> Tensor:
        state = self.start(src, src_lengths)
        emb = self.drop(self.tgt_embed(tgt_in))  # [B, T, d]
        pres = [self._decode(state, emb[:, t])[0] for t in range(tgt_in.size(1))]
        return self.head(torch.stack(pres, dim=1))  # [B, T, V]

    def step(self, state: DecodeState, prev: Tensor) -> tuple[Tensor, Tensor]:
        pre, alpha = self._decode(state, self.drop(self.tgt_embed(prev)))
        return self.head(pre).log_softmax(dim=-1), alpha


# ---------------------------------------------------------------------------------------------
# Transformer encoder-decoder (pre-norm), and its decoder's KV cache
# ---------------------------------------------------------------------------------------------
# The KV cache: without it, every decode step re-runs the decoder over the whole output so
# far, so a decode of ``T`` tokens costs ``O(T^2)`` decoder positions. With it, a step feeds the
# newest token only: its self-attention writes its keys and values into the next free slot of
# the cache and reads those of every earlier output position from it, and its cross-attention
# reads the encoder output's keys and values, projected once per decode in
# :func:`init_layer_cache`. Both call :class:`MultiHeadAttention`'s own steps (``project_q``,
# ``project_kv``, ``attend``), the ones its ``forward`` is made of, so the cached decode runs
# the arithmetic of the whole-prefix one.
#
# The cache lives in the :data:`DecodeState` dict, one entry per layer and tensor, every
# tensor with the rows on dim 0::
#
#     self_k.{l}, self_v.{l}    [N, H, slots, d]  keys/values of the output positions:
#                                                  slots 0 .. t-1 filled, the others free
#     self_len                  int               t, the output positions fed so far (the same
#                                                  in every row)
#     cross_k.{l}, cross_v.{l}  [N, H, S, d]      keys/values of the encoder output
#
# so :meth:`Seq2Seq.reorder` keeps, drops or duplicates a row's cache with the row when beam
# search reselects its beams (and keeps ``self_len``, every row's). The
# self-attention slots are allocated ahead: :data:`FIRST_SLOTS` at the start, twice as many
# whenever they are full, so a decode of ``T`` tokens copies ``O(T)`` cached positions in all to
# grow them, where appending with ``torch.cat`` copied the whole cache every step (``O(T^2)``).
# Beam search's :meth:`~Seq2Seq.reorder_beams` copies only the filled slots of the beams
# that take another beam's place, and leaves the cross-attention's, which beams share. (The GPT's
# :class:`~scratchgpt.models.gpt.KVCache` allocates its whole length up front and adds slots for
# left-padded prompts and rollback for speculative decoding; ``start`` is not told how long a
# decode will be, and a seq2seq decode needs neither, so plain tensors in the dict, which
# ``reorder`` already handles, hold this one.)

FIRST_SLOTS = 16  # self-attention slots per layer a decode starts with; doubled when full


def init_layer_cache(state: DecodeState, layer: int, cross: MultiHeadAttention,
                     memory: Tensor) -> None:
    """Layer ``layer``'s cache before the first step: the cross-attention's keys and values of
    ``memory [N, S, E]``, and :data:`FIRST_SLOTS` free self-attention slots."""
    k, v = cross.project_kv(memory)  # [N, H, S, d]
    state[f"cross_k.{layer}"], state[f"cross_v.{layer}"] = k, v
    n, heads, _, d = k.shape
    state[f"self_k.{layer}"] = k.new_zeros(n, heads, FIRST_SLOTS, d)  # [N, H, slots, d]
    state[f"self_v.{layer}"] = k.new_zeros(n, heads, FIRST_SLOTS, d)


def self_slots(state: DecodeState, layer: int, t: int) -> tuple[Tensor, Tensor]:
    """Layer ``layer``'s self-attention key and value slots ``[N, H, slots, d]``, with slot ``t``
    (the first free one) among them: when all are full, twice as many, the filled ones copied."""
    k, v = state[f"self_k.{layer}"], state[f"self_v.{layer}"]
    if t == k.size(2):
        k = torch.cat([k, torch.zeros_like(k)], dim=2)  # [N, H, 2 * slots, d]
        v = torch.cat([v, torch.zeros_like(v)], dim=2)
        state[f"self_k.{layer}"], state[f"self_v.{layer}"] = k, v
    return k, v


def self_attend(state: DecodeState, layer: int, attn: MultiHeadAttention, h: Tensor,
                t: int) -> Tensor:
    """Causal self-attention of the newest position ``h [N, 1, E]``, output position ``t``: its
    keys and values fill slot ``t`` of the cache, and it attends slots ``0 .. t`` (every earlier
    position, none later) -> ``[N, 1, E]``."""
    k_new, v_new = attn.project_kv(h)  # [N, H, 1, d]
    k_slots, v_slots = self_slots(state, layer, t)  # [N, H, slots, d]
    k_slots.narrow(2, t, 1).copy_(k_new)
    v_slots.narrow(2, t, 1).copy_(v_new)
    k, v = k_slots.narrow(2, 0, t + 1), v_slots.narrow(2, 0, t + 1)  # [N, H, t+1, d]
    return attn.attend(attn.project_q(h), k, v)[0]


def cross_attend(state: DecodeState, layer: int, attn: MultiHeadAttention,
                 h: Tensor) -> tuple[Tensor, Tensor]:
    """Cross-attention of ``h [N, 1, E]`` to the cached encoder keys/values ->
    (``[N, 1, E]``, probabilities ``[N, H, 1, S]``)."""
    pad = state["pad"]  # [N, S], True at padding
    masked = attention_mask(1, pad.size(1), key_padding_mask=pad)  # [N, 1, 1, S]
    q = attn.project_q(h)  # [N, H, 1, d]
    return attn.attend(q, state[f"cross_k.{layer}"], state[f"cross_v.{layer}"], masked)


class FeedForward(nn.Sequential):
    def __init__(self, d: int, d_ff: int, dropout: float):
        super().__init__(nn.Linear(d, d_ff), nn.GELU(), Dropout(dropout), nn.Linear(d_ff, d))


class EncoderLayer(nn.Module):
    """``x + SelfAttn(LN(x))`` then ``x + FFN(LN(x))``."""

    def __init__(self, c: Seq2SeqConfig):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(c.d_model), nn.LayerNorm(c.d_model)
        self.attn = MultiHeadAttention(c.d_model, c.n_head, c.dropout)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.dropout)
        self.drop = Dropout(c.dropout)

    def forward(self, x: Tensor, pad: Tensor) -> Tensor:
        h = self.ln1(x)
        x = x + self.drop(self.attn(h, h, h, key_padding_mask=pad)[0])
        return x + self.drop(self.ffn(self.ln2(x)))


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to the encoder, feed-forward; each pre-norm."""

    def __init__(self, c: Seq2SeqConfig):
        super().__init__()
        self.ln1, self.ln2, self.ln3 = (nn.LayerNorm(c.d_model) for _ in range(3))
        self.self_attn = MultiHeadAttention(c.d_model, c.n_head, c.dropout)
        self.cross_attn = MultiHeadAttention(c.d_model, c.n_head, c.dropout)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.dropout)
        self.drop = Dropout(c.dropout)

    def forward(
        self, y: Tensor, memory: Tensor, src_pad: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        h = self.ln1(y)
        y = y + self.drop(self.self_attn(h, h, h, causal=True)[0])
        ctx, w = self.cross_attn(self.ln2(y), memory, memory, key_padding_mask=src_pad,
                                 need_weights=need_weights, average_weights=False)
        y = y + self.drop(ctx)
        return y + self.drop(self.ffn(self.ln3(y))), w  # w: [B, heads, T, S] or None

    def step(self, y: Tensor, state: DecodeState, layer: int, t: int) -> tuple[Tensor, Tensor]:
        """:meth:`forward` for the newest position ``y [N, 1, d]`` (output position ``t``) alone,
        through the KV cache in ``state`` (see :func:`init_layer_cache`) ->
        (``[N, 1, d]``, cross-attention ``[N, heads, 1, S]``)."""
        y = y + self.drop(self_attend(state, layer, self.self_attn, self.ln1(y), t))
        ctx, w = cross_attend(state, layer, self.cross_attn, self.ln2(y))
        y = y + self.drop(ctx)
        return y + self.drop(self.ffn(self.ln3(y))), w


class TransformerSeq2Seq(Seq2Seq):
    """Vaswani et al. (2017) with pre-norm layers and sinusoidal positions.

    ``attn_layer``/``attn_head`` choose which cross-attention ``step`` reports (default: the last
    layer, averaged over heads). ``kv_cache`` (default True): ``start`` sets up a decode that
    feeds each step's newest token alone through a KV cache; False re-runs the decoder over the
    whole output so far at every step (same tokens, the cost growing with its square; kept to
    check the cache against).
    """

    def __init__(self, config: Seq2SeqConfig):
        super().__init__()
        self.config = config
        d = config.d_model
        self.src_embed = nn.Embedding(config.src_vocab, d, padding_idx=config.pad_id)
        self.tgt_embed = nn.Embedding(config.tgt_vocab, d, padding_idx=config.pad_id)
        # Embeddings start at std d^-1/2 so that, scaled by sqrt(d) in `_embed`, they are about
        # as large as the positions (entries in [-1, 1]); at std 1 they would drown them.
        for table in (self.src_embed, self.tgt_embed):
            nn.init.normal_(table.weight, std=d**-0.5)
            table.weight.data[config.pad_id].zero_()
        self.register_buffer("pos", sinusoidal_positions(config.max_positions, d),
                             persistent=False)
        self.drop = Dropout(config.dropout)
        self.enc_layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_layer))
        self.dec_layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_layer))
        self.enc_norm, self.dec_norm = nn.LayerNorm(d), nn.LayerNorm(d)
        self.head = nn.Linear(d, config.tgt_vocab)
        self.attn_layer: int = -1
        self.attn_head: int | None = None
        self.kv_cache = True

    # a decode step changes the self-attention slots ("self_k.", "self_v.") and, without the
    # cache, the output so far ("tokens")
    source_entries = ("pad", "memory", "cross_k.", "cross_v.")

    def filled(self, state: DecodeState, key: str, value: Tensor) -> Tensor:
        """The self-attention slots fed so far (``self_len`` of them; the rest are free)."""
        if key.startswith(("self_k.", "self_v.")):
            return value.narrow(2, 0, state["self_len"])
        return value

    def _embed(self, table: nn.Embedding, ids: Tensor, first: int = 0) -> Tensor:
        """``ids [B, T]`` at positions ``first .. first+T-1`` -> ``[B, T, d]``."""
        end = first + ids.size(1)
        if end > self.config.max_positions:
            raise ConfigError(f"sequence of {end} tokens exceeds max_positions "
                             f"{self.config.max_positions}")
        return self.drop(table(ids) * math.sqrt(self.config.d_model) + self.pos[first:end])

    def encode(self, src: Tensor, src_lengths: Tensor) -> tuple[Tensor, Tensor]:
        """-> (memory [B, S, d], pad [B, S])."""
        pad = padding_mask(src_lengths.to(src.device), src.size(1))
        x = self._embed(self.src_embed, src)
        for layer in self.enc_layers:
            x = layer(x, pad)
        return self.enc_norm(x), pad

    def decode(
        self, tgt_in: Tensor, memory: Tensor, pad: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, list[Tensor | None]]:
        """-> (logits [B, T, V], per-layer cross-attention [B, heads, T, S] or None)."""
        y = self._embed(self.tgt_embed, tgt_in)
        weights = []
        for layer in self.dec_layers:
            y, w = layer(y, memory, pad, need_weights)
            weights.append(w)
        return self.head(self.dec_norm(y)), weights

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor) -> Tensor:
        memory, pad = self.encode(src, src_lengths)
        return self.decode(tgt_in, memory, pad)[0]

    def start(self, src: Tensor, src_lengths: Tensor) -> DecodeState:
        memory, pad = self.encode(src, src_lengths)
        if not self.kv_cache:
            bos = torch.full((src.size(0), 0), self.config.bos_id, dtype=torch.long,
                             device=src.device)
            return {"memory": memory, "pad": pad, "tokens": bos}
        state: DecodeState = {"pad": pad, "self_len": 0}
        for i, layer in enumerate(self.dec_layers):
            init_layer_cache(state, i, layer.cross_attn, memory)
        return state

    def step(self, state: DecodeState, prev: Tensor) -> tuple[Tensor, Tensor]:
        if "tokens" in state:
            return self._step_uncached(state, prev)
        t = state["self_len"]  # output positions fed so far
        y = self._embed(self.tgt_embed, prev.unsqueeze(1), t)  # [N, 1, d]
        weights = []
        for i, layer in enumerate(self.dec_layers):
            y, w = layer.step(y, state, i, t)
            weights.append(w)
        state["self_len"] = t + 1
        logits = self.head(self.dec_norm(y[:, -1]))  # [N, V]
        w = weights[self.attn_layer][:, :, -1]  # [N, heads, S]
        return logits.float().log_softmax(dim=-1), self._reported(w)

    def _step_uncached(self, state: DecodeState, prev: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`step` without the cache: the decoder re-runs over the whole prefix."""
        state["tokens"] = torch.cat([state["tokens"], prev.unsqueeze(1)], dim=1)  # [N, t]
        logits, weights = self.decode(state["tokens"], state["memory"], state["pad"],
                                      need_weights=True)
        w = weights[self.attn_layer]
        assert w is not None
        return logits[:, -1].float().log_softmax(dim=-1), self._reported(w[:, :, -1])

    def _reported(self, w: Tensor) -> Tensor:
        """The cross-attention ``step`` reports, from the newest position's ``[N, heads, S]``."""
        return w.mean(dim=1) if self.attn_head is None else w[:, self.attn_head]
