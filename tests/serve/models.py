"""A tiny chat-tuned GPT checkpoint for the server's tests, trained here in a few seconds.

Its text mixes the generated play of ``tests/corpus.py`` with short chat transcripts in the
project's template, in which the assistant always answers ``ok`` and ends its turn: enough for
greedy completions far from ties, and a chat reply that stops at the template's end marker.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from scratchgpt.chat import DEFAULT_TEMPLATE, TEMPLATES
from scratchgpt.checkpoints import Checkpoint, save_checkpoint
from scratchgpt.models import build_model, model_config
from scratchgpt.tokenizers.bpe import BPETokenizer
from scratchgpt.tokenizers.char import CharTokenizer
from tests.corpus import play_text

TEMPLATE = TEMPLATES[DEFAULT_TEMPLATE]
REPLY = "ok"


def training_text(n_chats: int = 300) -> str:
    rng = random.Random(0)
    words = play_text(20_000).split()
    parts = []
    for i in range(n_chats):
        question = " ".join(rng.choice(words) for _ in range(rng.randint(1, 4)))
        parts.append(TEMPLATE.render([{"role": "user", "content": question},
                                      {"role": "assistant", "content": REPLY}],
                                     add_generation_prompt=False))
        parts.append(play_text(60, seed=i + 1))
    return "".join(parts)


def train_chat_gpt(steps: int = 200, block_size: int = 64) -> tuple[torch.nn.Module,
                                                                     CharTokenizer]:
    text = training_text()
    tok = CharTokenizer.train(text)
    data = torch.tensor(tok.encode(text))
    cfg = model_config("gpt", vocab_size=tok.vocab_size, block_size=block_size, n_layer=2,
                       n_head=2, n_embd=64)
    torch.manual_seed(0)
    model = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - block_size - 1, (16,), generator=gen)
        x = torch.stack([data[s:s + block_size] for s in starts])  # (16, T)
        y = torch.stack([data[s + 1:s + block_size + 1] for s in starts])
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.loss = loss.item()
    return model.eval(), tok


def save_run(model: torch.nn.Module, tok: CharTokenizer, out: Path, chat: bool = True) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    data = {"chat_template": DEFAULT_TEMPLATE} if chat else {}
    save_checkpoint(out / "best.pt", Checkpoint("gpt", model.config, model.state_dict(),
                                                {"text": tok.state()}, data))
    return out


def save_bpe_chat_run(out: Path) -> Path:
    """A chat run of an untrained one-layer GPT over a small byte-level BPE tokenizer (one
    with an ``<|endoftext|>`` special token), for what depends on how prompts are encoded."""
    text = TEMPLATE.render([{"role": "user", "content": "the cat sat"},
                            {"role": "assistant", "content": "on the mat"}],
                           add_generation_prompt=False) * 20
    tok = BPETokenizer.train(text, vocab_size=300)
    cfg = model_config("gpt", vocab_size=tok.vocab_size, block_size=64, n_layer=1, n_head=1,
                       n_embd=16)
    torch.manual_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(out)  # (its merges.txt: the checkpoint's tokenizer reads them from beside it)
    save_checkpoint(out / "best.pt", Checkpoint("gpt", cfg, build_model(cfg).state_dict(),
                                                {"text": tok.state()},
                                                {"chat_template": DEFAULT_TEMPLATE}))
    return out
