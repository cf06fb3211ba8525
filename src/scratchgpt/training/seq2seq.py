"""Training and evaluation of the encoder-decoder models on (source, target) pairs.

Training: AdamW, linear warmup then cosine decay, gradient clipping, teacher forcing with
cross-entropy, batches of similar source length (less padding), stopped by a step count and/or a
wall-clock budget. With a time budget the cosine schedule follows elapsed time, so the learning
rate reaches its floor when the budget runs out, whatever the speed of the machine.

Evaluation: exact match of greedy (or beam) decodes against the references, overall and by
source length.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from scratchgpt.data.translation import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    DataSpec,
    Pair,
    Seq2SeqTokenizer,
)
from scratchgpt.models.seq2seq import Seq2Seq, build_seq2seq, default_config

Example = tuple[list[int], list[int]]  # (source ids ending in <eos>, target ids without specials)


def encode_pairs(
    pairs: Sequence[Pair], src_tok: Seq2SeqTokenizer, tgt_tok: Seq2SeqTokenizer
) -> list[Example]:
    """Strings -> ids. Sources get a closing ``<eos>``; unknown characters become ``<unk>``."""
    return [(src_tok.encode(s) + [EOS_ID], tgt_tok.encode(t)) for s, t in pairs]


def collate(batch: Sequence[Example]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """-> src [B, S], src_lengths [B], tgt_in [B, T] (``<bos> y``), tgt_out [B, T] (``y <eos>``),
    right-padded with ``<pad>``."""
    b = len(batch)
    s = max(len(x) for x, _ in batch)
    t = max(len(y) for _, y in batch) + 1
    src = torch.full((b, s), PAD_ID, dtype=torch.long)
    tgt_in = torch.full((b, t), PAD_ID, dtype=torch.long)
    tgt_out = torch.full((b, t), PAD_ID, dtype=torch.long)
    for i, (x, y) in enumerate(batch):
        src[i, : len(x)] = torch.tensor(x)
        tgt_in[i, : len(y) + 1] = torch.tensor([BOS_ID] + y)
        tgt_out[i, : len(y) + 1] = torch.tensor(y + [EOS_ID])
    lengths = torch.tensor([len(x) for x, _ in batch])
    return src, lengths, tgt_in, tgt_out


def length_batches(n_items: int, lengths: Sequence[int], batch_size: int,
                   rng: random.Random) -> list[list[int]]:
    """One epoch of index batches: sorted by length (ties broken at random), cut into batches,
    batches shuffled."""
    order = sorted(range(n_items), key=lambda i: (lengths[i], rng.random()))
    batches = [order[i : i + batch_size] for i in range(0, n_items, batch_size)]
    rng.shuffle(batches)
    return batches


@dataclass
class TrainConfig:
    """Optimisation settings. Training stops at ``max_steps`` or ``time_budget`` seconds,
    whichever comes first (at least one must be set)."""

    batch_size: int = 128
    lr: float = 1e-3
    min_lr_ratio: float = 0.05  # cosine floor, as a fraction of lr
    warmup_steps: int = 200
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    label_smoothing: float = 0.0
    max_steps: int | None = None
    time_budget: float | None = None  # seconds
    bf16: bool = False  # autocast matmuls to bfloat16 (CPU or CUDA)
    seed: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        if self.max_steps is None and self.time_budget is None:
            raise ValueError("set max_steps or time_budget")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError("max_steps must be >= 1")
        if self.time_budget is not None and self.time_budget <= 0:
            raise ValueError("time_budget must be > 0")
        if self.batch_size < 1 or self.lr <= 0 or self.warmup_steps < 0:
            raise ValueError("batch_size >= 1, lr > 0, warmup_steps >= 0 required")


def lr_at(step: int, progress: float, cfg: TrainConfig) -> float:
    """Linear warmup over ``warmup_steps``, then cosine from ``lr`` to ``lr * min_lr_ratio`` as
    ``progress`` goes from 0 to 1."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


@dataclass
class TrainResult:
    steps: int
    seconds: float
    examples: int
    losses: list[float] = field(default_factory=list)  # mean loss of each logged window

    @property
    def final_loss(self) -> float:
        return self.losses[-1] if self.losses else float("nan")


def autocast(device: torch.device, enabled: bool):
    """bfloat16 autocast context on ``device`` (a no-op when disabled)."""
    if not enabled:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def sequence_loss(model: Seq2Seq, batch: tuple[Tensor, ...], label_smoothing: float = 0.0
                  ) -> Tensor:
    """Mean cross-entropy over the real (non-pad) target tokens of a collated batch."""
    src, lengths, tgt_in, tgt_out = batch
    logits = model(src, lengths, tgt_in)  # [B, T, V]
    return F.cross_entropy(logits.flatten(0, 1).float(), tgt_out.flatten(),
                           ignore_index=PAD_ID, label_smoothing=label_smoothing)


def train_seq2seq(
    model: Seq2Seq,
    examples: Sequence[Example],
    cfg: TrainConfig,
    log_every: int = 50,
    on_log: Callable[[int, float], None] | None = None,
) -> TrainResult:
    """Train ``model`` in place on ``examples``; returns steps, time and the loss history."""
    from tqdm.auto import tqdm

    device = next(model.parameters()).device
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2 or "embed" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)
    lengths = [len(x) for x, _ in examples]
    total = cfg.max_steps if cfg.max_steps is not None else None
    bar = tqdm(total=total, disable=not cfg.progress, unit="step", dynamic_ncols=True,
               desc=f"train {model.config.arch}")
    result = TrainResult(steps=0, seconds=0.0, examples=0)
    window: list[float] = []
    model.train()
    t0 = time.perf_counter()
    step = 0
    while True:
        for idx in length_batches(len(examples), lengths, cfg.batch_size, rng):
            elapsed = time.perf_counter() - t0
            progress = max(step / cfg.max_steps if cfg.max_steps else 0.0,
                           elapsed / cfg.time_budget if cfg.time_budget else 0.0)
            if progress >= 1.0:
                break
            for group in opt.param_groups:
                group["lr"] = lr_at(step, progress, cfg)
            batch = tuple(t.to(device) for t in collate([examples[i] for i in idx]))
            with autocast(device, cfg.bf16):
                loss = sequence_loss(model, batch, cfg.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            step += 1
            result.examples += len(idx)
            window.append(loss.item())
            if step % log_every == 0:
                mean = sum(window) / len(window)
                result.losses.append(mean)
                window = []
                bar.set_postfix(loss=f"{mean:.4f}", lr=f"{opt.param_groups[0]['lr']:.2e}")
                if on_log is not None:
                    on_log(step, mean)
            bar.update(1)
        else:
            continue  # epoch finished: start another
        break
    if window:
        result.losses.append(sum(window) / len(window))
    bar.close()
    model.eval()
    result.steps, result.seconds = step, time.perf_counter() - t0
    return result


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------


@dataclass
class EvalResult:
    correct: int
    total: int
    by_length: dict[str, tuple[int, int]]  # "lo-hi" source characters -> (correct, total)
    predictions: list[str]

    @property
    def exact_match(self) -> float:
        return self.correct / max(self.total, 1)


def length_bucket(n: int, width: int = 5) -> str:
    lo = (n - 1) // width * width + 1
    return f"{lo:>2}-{lo + width - 1}"


def translate(
    model: Seq2Seq, sources: Sequence[str], src_tok: Seq2SeqTokenizer,
    tgt_tok: Seq2SeqTokenizer, beam: int = 1, max_len: int = 64, batch_size: int = 256,
    length_penalty: float = 1.0,
) -> tuple[list[str], list[list[int]], list[Tensor]]:
    """Decode ``sources``; -> (texts, token ids, attention [out tokens, source tokens] each)."""
    device = next(model.parameters()).device
    model.eval()
    texts, all_ids, all_attn = [], [], []
    examples = [(src_tok.encode(s) + [EOS_ID], []) for s in sources]
    for i in range(0, len(examples), batch_size):
        src, lengths, _, _ = collate(examples[i : i + batch_size])
        src, lengths = src.to(device), lengths.to(device)
        if beam == 1:
            ids, attn = model.greedy_decode(src, lengths, max_len)
        else:
            ids, attn = model.beam_decode(src, lengths, beam, max_len, length_penalty)
        texts += [tgt_tok.decode(x) for x in ids]
        all_ids += ids
        all_attn += attn
    return texts, all_ids, all_attn


def evaluate(
    model: Seq2Seq, pairs: Sequence[Pair], src_tok: Seq2SeqTokenizer,
    tgt_tok: Seq2SeqTokenizer, beam: int = 1, max_len: int | None = None,
) -> EvalResult:
    """Exact-match accuracy of decoded targets, overall and by source length."""
    if max_len is None:
        max_len = max(len(t) for _, t in pairs) * 2 + 2
    preds, _, _ = translate(model, [s for s, _ in pairs], src_tok, tgt_tok, beam, max_len)
    by_length: dict[str, tuple[int, int]] = {}
    correct = 0
    for (s, t), p in zip(pairs, preds, strict=True):
        ok = int(p == t)
        correct += ok
        key = length_bucket(len(s))
        c, n = by_length.get(key, (0, 0))
        by_length[key] = (c + ok, n + 1)
    return EvalResult(correct, len(pairs), dict(sorted(by_length.items())), preds)


# ---------------------------------------------------------------------------------------------
# One whole run: data -> tokenizers -> model -> training -> held-out evaluation
# ---------------------------------------------------------------------------------------------


@dataclass
class FitResult:
    model: Seq2Seq
    src_tok: Seq2SeqTokenizer
    tgt_tok: Seq2SeqTokenizer
    train: TrainResult
    eval: EvalResult
    held_out: list[Pair]


def fit(
    data: DataSpec, arch: str, cfg: TrainConfig, model_overrides: dict | None = None,
    device: str = "cpu", log: Callable[[str], None] = print,
) -> FitResult:
    """Build tokenizers from the training pairs, train a default-sized ``arch`` model (with
    ``model_overrides``), and measure exact match on the held-out pairs."""
    train_pairs, held = data.load()
    src_tok = Seq2SeqTokenizer.train(s for s, _ in train_pairs)
    tgt_tok = Seq2SeqTokenizer.train(t for _, t in train_pairs)
    torch.manual_seed(cfg.seed)
    model = build_seq2seq(default_config(arch, src_tok.vocab_size, tgt_tok.vocab_size,
                                         **(model_overrides or {}))).to(device)
    log(f"{arch}: {model.num_params():,} parameters, {len(train_pairs):,} training pairs, "
        f"{len(held):,} held out ({data.describe()})")
    tr = train_seq2seq(model, encode_pairs(train_pairs, src_tok, tgt_tok), cfg)
    log(f"{arch}: {tr.steps} steps in {tr.seconds:.0f}s, final loss {tr.final_loss:.4f}")
    ev = evaluate(model, held, src_tok, tgt_tok)
    return FitResult(model, src_tok, tgt_tok, tr, ev, held)


def format_eval(ev: EvalResult) -> str:
    """Multi-line report: exact match overall and by source length."""
    lines = [f"exact match {ev.exact_match:.2%} ({ev.correct}/{ev.total})",
             "  source chars   exact match"]
    for key, (c, n) in ev.by_length.items():
        lines.append(f"  {key:>12}   {c / n:7.2%}  ({c}/{n})")
    return "\n".join(lines)
