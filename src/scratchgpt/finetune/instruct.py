"""Instruction tuning on the training core: conversations -> a GPT that answers in the chat
template and stops at its end marker.

Each conversation is written with the chat template (``chat.py``) and tokenized piece by piece
(:meth:`~scratchgpt.chat.ChatTemplate.segments`), so every token knows whether it belongs to an
assistant reply (with its ``<|end|>`` marker) or to the prompt. The loss is next-token
cross-entropy on reply tokens only: a target whose token is part of the prompt is replaced by
``IGNORE`` (-100), as is padding. A model learns to answer, not to predict the questions, and
learns to end its turn, which is where generation stops.

Batches are length-grouped epochs (``training/epochs.py``), right-padded. A conversation longer
than the context keeps its first ``block_size + 1`` tokens (a warning counts them); one whose
reply starts beyond the context has nothing left to learn and is left out (counted too).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import InitVar, asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scratchgpt.chat import DEFAULT_TEMPLATE, TEMPLATES, ChatTemplate, Message
from scratchgpt.errors import ConfigError, DataError
from scratchgpt.finetune.data import (
    Log,
    check_unchanged,
    encode_plain,
    lacking_characters,
    random_split,
    read_conversations,
    shown_characters,
    split_digest,
)
from scratchgpt.training.epochs import EpochBatches
from scratchgpt.training.task import Batch, EvalSetting, _eval_mode
from scratchgpt.validation import KEYWORDS, named
from scratchgpt.wording import plural, some_of

IGNORE = -100  # F.cross_entropy's ignore_index: targets that carry no loss
Example = tuple[list[int], list[bool]]  # (tokens, whether each token is a reply token)


@dataclass
class InstructSpec:
    """Where an instruction run's data comes from and how it is split; saved with the run
    (``data["instruct"]``)."""

    data: str | None = None
    dataset: str | None = None
    sha256: str = ""
    split_seed: int = 0
    held_out: float = 0.1  # fraction of conversations held out for validation
    max_length: int = 0  # tokens per conversation (0: the model's context)
    template: str = DEFAULT_TEMPLATE
    eval_generate: int = 0  # held-out conversations answered greedily at the end (exact match)
    # how a refusal names a setting: the Python API's keywords, or finetune's flags (FLAGS);
    # not a field, so neither saved with the run nor compared
    options: InitVar[Mapping[str, str]] = KEYWORDS

    def __post_init__(self, options: Mapping[str, str]) -> None:
        if not 0 < self.held_out < 1:
            raise ConfigError(f"{named(options, 'held_out')} must be in (0, 1), got "
                              f"{self.held_out}")
        if self.template not in TEMPLATES:
            raise ConfigError(f"unknown chat template {self.template!r}")
        for name in ("max_length", "eval_generate"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{named(options, name)} must be >= 0, got "
                                  f"{getattr(self, name)}")


def encode_conversation(tokenizer: Any, template: ChatTemplate, messages: Sequence[Message],
                        add_generation_prompt: bool = False) -> tuple[Example, bool]:
    """((tokens, is-reply flags), whether characters were replaced): each template segment
    encoded on its own, so the flags are exact. Generation prompts are encoded the same way
    (``add_generation_prompt``), so a model sees at inference the tokens it was trained on."""
    tokens: list[int] = []
    flags: list[bool] = []
    replaced = False
    for text, target in template.segments(messages, add_generation_prompt):
        ids, rep = encode_plain(tokenizer, text)
        tokens += ids
        flags += [target] * len(ids)
        replaced |= rep
    return (tokens, flags), replaced


def check_template_spelling(tokenizer: Any, template: ChatTemplate) -> None:
    """The tokenizer can write the template's markers (a character tokenizer lacking ``|``
    could never produce ``<|end|>``, so generation would never stop)."""
    for marker in (*(m for _, m in template.markers), template.end):
        ids, replaced = encode_plain(tokenizer, marker)
        if replaced or tokenizer.decode(ids) != marker:
            lacking = lacking_characters(tokenizer, [marker])
            why = (f"its vocabulary lacks {shown_characters(lacking)}" if lacking else
                   "a character vocabulary without some of its characters?")
            raise DataError(f"the base's tokenizer cannot write the chat template's marker "
                            f"{marker!r} ({why}); pretrain on text that contains them")


def inputs_and_targets(example: Example) -> tuple[list[int], list[int]]:
    """x = tokens[:-1]; y = tokens[1:] with every non-reply token replaced by IGNORE."""
    tokens, flags = example
    return tokens[:-1], [t if f else IGNORE for t, f in zip(tokens[1:], flags[1:],
                                                               strict=True)]


@dataclass
class InstructData:
    train: list[Example]
    held_out: list[Example]
    held_out_chats: list[list[Message]]
    record: dict[str, Any]


def load_data(spec: InstructSpec, tokenizer: Any, block_size: int, log: Log = None
              ) -> InstructData:
    """Read, check, split and encode ``spec``'s conversations."""
    chats, where, sha = read_conversations(spec.data, spec.dataset)
    check_unchanged(where, sha, spec.sha256)
    if len(chats) < 2:
        raise DataError(f"{where}: needs at least 2 conversations (one to hold out)")
    train_idx, held_idx = random_split(len(chats), spec.held_out, spec.split_seed)
    if not train_idx:
        raise ConfigError(f"--held-out {spec.held_out:g} leaves no conversation to train on "
                          f"({len(chats)} conversations in {where}, {len(held_idx)} held out); "
                          "give a smaller fraction")
    template = TEMPLATES[spec.template]
    check_template_spelling(tokenizer, template)
    for i, chat in enumerate(chats, 1):  # a marker in a text would teach a turn nobody wrote
        template.check(chat, f"{where} record {i}, messages")
    max_length = min(spec.max_length or block_size, block_size)
    counts: dict[str, Any] = {"truncated": 0, "dropped": 0, "replaced": 0}
    encoded = [_fit(encode_conversation(tokenizer, template, c), max_length, counts)
               for c in chats]
    keep = [i for i in train_idx if encoded[i] is not None]
    held = [i for i in held_idx if encoded[i] is not None]
    _check_some_reply_fits(where, max_length, {"training": (len(keep), len(train_idx)),
                                               "held-out": (len(held), len(held_idx))})
    if counts["replaced"] and log is not None:
        counts["lacking"] = lacking_characters(tokenizer, (m["content"] for c in chats
                                                           for m in c))
    _notify(log, counts, len(chats), max_length)
    record = {**asdict(spec), "sha256": sha, "max_length": max_length, "source": where,
              "split_sizes": {"train": len(keep), "val": len(held)},
              "split_digest": split_digest([train_idx, held_idx]),
              **{k: counts[k] for k in ("truncated", "dropped", "replaced")}}
    return InstructData([encoded[i] for i in keep], [encoded[i] for i in held],
                        [chats[i] for i in held], record)


def _check_some_reply_fits(where: str, max_length: int,
                           kept: dict[str, tuple[int, int]]) -> None:
    """Each side of the split keeps a conversation with a reply within the context; ``kept``
    maps a side to (conversations kept, conversations it had)."""
    empty = [(side, n) for side, (k, n) in kept.items() if k == 0]
    if len(empty) == len(kept):
        raise DataError(f"{where}: no conversation has a reply within the first {max_length} "
                        "tokens")
    if empty:
        side, n = empty[0]
        raise DataError(f"{where}: none of the {n} {side} conversation{'s' * (n != 1)} has a "
                        f"reply within the first {max_length} tokens (another --split-seed, or "
                        "shorter prompts?)")


def _fit(encoded: tuple[Example, bool], max_length: int,
         counts: dict[str, int]) -> Example | None:
    """The example cut to ``max_length + 1`` tokens (inputs fill the context), or None when
    no reply token is left to predict."""
    (tokens, flags), replaced = encoded
    counts["replaced"] += replaced
    if len(tokens) > max_length + 1:
        tokens, flags = tokens[:max_length + 1], flags[:max_length + 1]
        counts["truncated"] += 1
    if not any(flags[1:]):
        counts["dropped"] += 1
        return None
    return tokens, flags


def _notify(log: Log, counts: dict[str, Any], n: int, max_length: int) -> None:
    from scratchgpt.finetune.classify import replaced_warning

    if log is None:
        return
    if counts["truncated"]:
        # (the token after the last input is kept, as a target: the count the cut keeps,
        # context + 1, read beside the context as one token too many)
        one = counts["truncated"] == 1
        log(f"warning: {some_of(counts['truncated'], n, 'conversation')} longer than the "
            f"context ({max_length} tokens); {'it' if one else 'each'} is truncated to fit it: "
            f"its first {max_length} tokens are read, each to predict the next")
    if counts["dropped"]:
        one = counts["dropped"] == 1
        log(f"warning: {some_of(counts['dropped'], n, 'conversation', ('has', 'have'))} no "
            f"reply within the context and {'is' if one else 'are'} left out")
    if counts["replaced"]:
        log(replaced_warning(counts["replaced"], n, "conversation", counts["lacking"]))


def collate(examples: Sequence[Example], pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """-> x (B, T) right-padded with ``pad_id``, y (B, T) targets, IGNORE on prompt and pad."""
    pairs = [inputs_and_targets(e) for e in examples]
    T = max(len(x) for x, _ in pairs)
    x = torch.full((len(pairs), T), pad_id, dtype=torch.long)  # (B, T)
    y = torch.full((len(pairs), T), IGNORE, dtype=torch.long)  # (B, T)
    for i, (xi, yi) in enumerate(pairs):
        x[i, :len(xi)] = torch.tensor(xi)
        y[i, :len(yi)] = torch.tensor(yi)
    return x, y


def response_loss(logits: Tensor, y: Tensor, reduction: str = "mean") -> Tensor:
    """Cross-entropy over the reply tokens only. logits (B, T, V), y (B, T) with IGNORE."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1),
                           ignore_index=IGNORE, reduction=reduction)


class InstructTask:
    """Instruction tuning for the training core (see the module docstring)."""

    def __init__(self, data: InstructData, tokenizer: Any,
                 extra_data: dict[str, Any] | None = None, progress: bool = False):
        self.examples, self.tokenizer = data, tokenizer
        # a bar on stderr while the greedy replies of eval_generate are generated (seconds)
        self.progress = progress
        self.spec = InstructSpec(**{k: v for k, v in data.record.items()
                                    if k in InstructSpec.__dataclass_fields__})
        self.template = TEMPLATES[self.spec.template]
        self.epochs = EpochBatches([len(t) for t, _ in data.train])
        self.extra_data = extra_data or {}
        self.final_eval: GenerationEval | None = None
        # the base's held-out figures before training (val_loss, exact_match), which a new
        # run measures before its first step: kept in the run's state, so that a resumed run
        # reports them beside its own
        self.before: dict[str, float] = {}

    def train_batch(self, batch_size: int, generator: torch.Generator,
                    shard: tuple[int, int] = (0, 1)) -> Batch:
        idx = self.epochs.next(batch_size, generator, shard)
        return collate([self.examples.train[i] for i in idx])

    def warm_up_batch(self, batch_size: int, seq_len: int | None = None) -> Batch:
        """A batch of the training batches' shape that draws from no generator and moves no
        epoch: the first ``batch_size`` training conversations (the trainer's untimed warm-up
        step; ``seq_len`` is a language model's: this task refuses a sequence-length warmup)."""
        return collate(self.examples.train[:batch_size])

    @staticmethod
    def loss(model: nn.Module, batch: Batch) -> Tensor:
        x, y = batch
        return response_loss(model(x), y)

    def batch_tokens(self, batch: Batch) -> int:
        return int((batch[1] != IGNORE).sum())

    @torch.no_grad()
    def estimate(self, model: nn.Module, split: str, iters: int, setting: EvalSetting) -> float:
        """Response loss per reply token over the first ``iters`` batches of a split."""
        examples = self.examples.train if split == "train" else self.examples.held_out
        return held_out_loss(model, examples[:iters * setting.batch_size], setting.batch_size,
                             setting.device)

    def final_metrics(self, model: nn.Module, iters: int,
                      setting: EvalSetting) -> dict[str, float]:
        """Train estimate, the response loss over every held-out conversation, and (with
        ``eval_generate``) the exact match of greedy replies."""
        metrics = {"train_loss": self.estimate(model, "train", iters, setting),
                   "val_loss": held_out_loss(model, self.examples.held_out, setting.batch_size,
                                             setting.device, progress="held-out loss"
                                             if setting.progress else None)}
        if chats := self.generated_chats():
            self.final_eval = exact_match(model, self.tokenizer, self.template, chats,
                                          progress=self.progress)
            metrics["exact_match"] = self.final_eval.rate
        return metrics

    def generated_chats(self) -> list[list[Message]]:
        """The held-out conversations whose last reply :meth:`final_metrics` generates
        greedily: the first ``eval_generate`` (none without it)."""
        return self.examples.held_out_chats[:self.spec.eval_generate]

    def final_scope(self) -> str:
        """What :meth:`final_metrics` goes through, said before it by a run its budget ended:
        every held-out conversation's response loss, and the greedy replies it generates."""
        held = plural(len(self.examples.held_out), "held-out conversation", grouped=True)
        replies = len(self.generated_chats())
        return (f"the response loss over the {held}"
                + (f" and {plural(replies, 'greedy reply', 'greedy replies', grouped=True)}"
                   if replies else ""))

    def report(self) -> str:
        return "" if self.final_eval is None else self.final_eval.describe("held-out")

    def tokenizers(self) -> dict[str, Any]:
        return {"text": self.tokenizer}

    def data(self) -> dict[str, Any]:
        return {"task": "instruct", "instruct": self.examples.record,
                "chat_template": self.template.name, **self.extra_data}

    def state_dict(self) -> dict[str, Any]:
        return {**self.epochs.state_dict(), "before": dict(self.before)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epochs.load_state_dict(state)
        self.before = dict(state.get("before") or {})  # (none in a run from before it was kept)


@torch.no_grad()
def held_out_loss(model: nn.Module, examples: Sequence[Example], batch_size: int,
                  device: torch.device | str = "cpu", progress: str | None = None) -> float:
    """Response loss per reply token (nats) over ``examples``, in fp32. ``progress``: the name
    of a bar on stderr, by conversations, shown once the pass has run for a second."""
    from scratchgpt.bars import named_bar  # (not for training's imports)

    total, count = 0.0, 0
    order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
    with _eval_mode(model), named_bar(len(order), progress, "conversation") as bar:
        for start in range(0, len(order), batch_size):
            x, y = collate([examples[i] for i in order[start:start + batch_size]])
            x, y = x.to(device), y.to(device)
            total += response_loss(model(x), y, reduction="sum").item()
            count += int((y != IGNORE).sum())
            bar.update(x.size(0))
    return total / max(count, 1)


# ---- answers generated by the model


@dataclass
class GenerationEval:
    """Greedy replies to held-out prompts against their references."""

    prompts: list[str]
    replies: list[str]
    references: list[str]

    @property
    def hits(self) -> list[bool]:
        """Whether each reply matches its reference (surrounding whitespace aside)."""
        return [r.strip() == ref.strip() for r, ref in zip(self.replies, self.references,
                                                             strict=True)]

    @property
    def correct(self) -> int:
        return sum(self.hits)

    @property
    def rate(self) -> float:
        return self.correct / max(len(self.replies), 1)

    def describe(self, what: str, samples: int = 3) -> str:
        lines = [f"{what} exact match {self.rate:.2%} ({self.correct}/{len(self.replies)}, "
                 "greedy replies)"]
        for prompt, reply, ref in list(zip(self.prompts, self.replies, self.references,
                                           strict=True))[:samples]:
            lines += [f"  prompt:    {prompt!r}", f"  reply:     {reply!r}",
                      f"  reference: {ref!r}"]
        return "\n".join(lines)


def split_last_reply(chat: Sequence[Message]) -> tuple[list[Message], str]:
    """(the messages before the last assistant reply, that reply)."""
    last = max(i for i, m in enumerate(chat) if m["role"] == "assistant")
    return list(chat[:last]), chat[last]["content"]


@torch.no_grad()
def reply(model: nn.Module, tokenizer: Any, template: ChatTemplate,
          prompts: Sequence[Sequence[Message]], max_new_tokens: int = 256,
          temperature: float = 0.0) -> list[str]:
    """The model's replies to each conversation (greedy by default), generated as one batch;
    each stops at the template's end marker, or at another turn's marker, and reads as
    ``chat``'s and ``serve``'s replies do (:func:`~scratchgpt.serve.reply.reply_text`)."""
    from scratchgpt.generation.generate import generate_batch
    from scratchgpt.generation.sampling import SamplingConfig
    from scratchgpt.generation.stopping import StopRule
    from scratchgpt.serve.reply import reply_text

    ids = [encode_conversation(tokenizer, template, p, add_generation_prompt=True)[0][0]
           for p in prompts]
    rule = StopRule(max_new_tokens, tokenizer.eot_id, template.reply_stops, tokenizer.decode)
    with _eval_mode(model):
        out = generate_batch(model, ids, rule, SamplingConfig(temperature))
    return [reply_text(rule, template, new) for new in out]


def exact_match(model: nn.Module, tokenizer: Any, template: ChatTemplate,
                chats: Sequence[Sequence[Message]], batch_size: int = 32,
                progress: bool = False) -> GenerationEval:
    """Greedy replies to the prompts of ``chats`` against their last assistant messages.
    ``progress``: a bar on stderr, by replies, once they have taken a second (generating a
    few dozen took some 18 s on a busy machine, with nothing said)."""
    from scratchgpt.bars import progress_bar

    prompts, refs = zip(*(split_last_reply(c) for c in chats), strict=True)
    longest = max(len(encode_plain(tokenizer, r)[0]) for r in refs)
    replies: list[str] = []
    with progress_bar(len(prompts), progress, "greedy replies", "reply") as bar:
        for i in range(0, len(prompts), batch_size):
            replies += reply(model, tokenizer, template, prompts[i:i + batch_size],
                             max_new_tokens=longest + 8)
            bar.update(len(prompts[i:i + batch_size]))
    return GenerationEval([p[-1]["content"] for p in prompts], replies, list(refs))
