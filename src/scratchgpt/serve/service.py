"""From API requests to engine jobs, and from the engine's tokens back to API responses.

:class:`Service` holds what every request needs (the engine, the tokenizer, the chat template,
the limits): it encodes prompts, builds one :class:`~scratchgpt.serve.batch.Job` per prompt
(``n`` choices each), and turns the tokens that come back into text with
:class:`~scratchgpt.generation.stopping.StreamText` (stop strings cut, partial characters held
back; a chat reply cut short leaves out the start of the template's marker it was writing,
:class:`~scratchgpt.serve.reply.ReplyText`, as ``scratchgpt chat`` does). :func:`complete` and
:func:`chat` give the whole response; :func:`stream_completion` and :func:`stream_chat` the
server-sent events, one chunk per choice per engine step.
"""

from __future__ import annotations

import asyncio
import codecs
import dataclasses
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from scratchgpt.chat import ChatTemplate, Message
from scratchgpt.data.prepare import encode_corpus
from scratchgpt.errors import ScratchGPTError
from scratchgpt.generation.prompt import start_of_text
from scratchgpt.generation.sampling import SamplingConfig
from scratchgpt.generation.stopping import StopRule, StreamText
from scratchgpt.serve import protocol as api
from scratchgpt.serve.batch import Ended, Failed, Job, PromptScores, TokenOut, TopLogprobs
from scratchgpt.serve.engine import Engine, EngineStopped, QueueFull
from scratchgpt.serve.metrics import Metrics
from scratchgpt.serve.reply import ReplyText


@dataclass(frozen=True)
class ModelInfo:
    """What the server says about its model (``/v1/models``, the playground)."""

    id: str
    model_type: str
    vocab_size: int
    context: int | None
    dtype: str
    n_layer: int | None = None  # GPTs: the attention view's layers and heads
    n_head: int | None = None
    chat_template: str | None = None
    created: int = 0  # when the weights were written (Unix seconds), as OpenAI's ``created``

    def card(self) -> dict[str, Any]:
        """``/v1/models``'s entry; the fields after ``owned_by`` are this server's own."""
        return {"id": self.id, "object": "model", "created": self.created,
                "owned_by": "scratchgpt",
                "model_type": self.model_type, "vocab_size": self.vocab_size,
                "context_length": self.context, "dtype": self.dtype, "n_layer": self.n_layer,
                "n_head": self.n_head, "chat_template": self.chat_template,
                "attention": self.n_layer is not None}


@dataclass
class Service:
    """Everything a request handler needs."""

    engine: Engine
    tokenizer: Any
    info: ModelInfo
    template: ChatTemplate | None
    limits: api.Limits
    metrics: Metrics
    timeout_s: float = 600.0
    attention_tokens: int = 256  # the playground's attention maps show at most this many

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.info.id:
            raise api.ApiError(404, f"The model '{name}' does not exist; this server has "
                                    f"'{self.info.id}'", param="model", code="model_not_found")

    def encode(self, prompt: str | list[int], param: str = "prompt") -> tuple[list[int], str]:
        """A prompt's token ids and text; an empty prompt starts unconditionally; too long
        a prompt is a 400 with OpenAI's code ``context_length_exceeded``. ``param``: the request's
        field it came from, for errors."""
        ids, text = self.tokens(prompt, param)
        if not ids:
            ids = start_of_text(self.tokenizer)[0]
        return self.within_limit(ids, param), text

    def within_limit(self, ids: list[int], param: str) -> list[int]:
        """``ids``, unless longer than the server takes: then a 400 with OpenAI's code."""
        if len(ids) > self.limits.max_prompt_tokens:
            raise api.ApiError(400, f"the prompt has {len(ids)} tokens; this server takes at "
                                    f"most {self.limits.max_prompt_tokens}", param=param,
                               code="context_length_exceeded")
        return ids

    def chat_prompt(self, messages: Sequence[Message]) -> list[int]:
        """A conversation's prompt tokens, encoded as fine-tuning encoded the model's
        conversations and as ``chat`` and ``sample --chat`` encode theirs
        (:func:`~scratchgpt.finetune.instruct.encode_conversation`: each piece of the template
        on its own, and a special token's spelling in a message, ``<|endoftext|>``, plain
        text); a message with characters the model does not know is a 400 naming them."""
        from scratchgpt.finetune.instruct import encode_conversation

        assert self.template is not None
        try:
            (ids, _), replaced = encode_conversation(self.tokenizer, self.template, messages,
                                                     add_generation_prompt=True)
        except ScratchGPTError as e:  # "messages[2]: ...": the message at fault is the param
            at = re.match(r"messages\[\d+\]", str(e))
            raise api.ApiError(400, str(e), param=at.group() if at else "messages") from None
        if replaced:  # the same words as a prompt's: the characters, named
            self.tokens(self.template.render(messages), "messages")
        return self.within_limit(ids, "messages")

    def tokens(self, prompt: str | list[int], param: str = "prompt") -> tuple[list[int], str]:
        """Token ids (checked against the vocabulary) and text of a prompt given as either
        (``param``: the request's field it came from, for errors). Text is read as ``sample``
        and ``prepare`` read it: a literal ``<|endoftext|>`` is the end-of-text token."""
        if isinstance(prompt, list):
            bad = [t for t in prompt if not 0 <= t < self.info.vocab_size]
            if bad:
                raise api.ApiError(400, f"token id {bad[0]} is outside the vocabulary "
                                        f"(0..{self.info.vocab_size - 1})", param=param)
            ids, text = prompt, self.tokenizer.decode(prompt)
        else:
            try:
                ids, text = encode_corpus(self.tokenizer, prompt, "error"), prompt
            except ScratchGPTError as e:
                raise api.ApiError(400, f"the {param} cannot be encoded: {e}",
                                   param=param) from None
        return ids, text

    def job(self, ids: list[int], gen: api.Generation, stops: Sequence[str],
            prompt_logprobs: bool = False) -> Job:
        rule = StopRule(gen.max_tokens, self.tokenizer.eot_id, tuple(stops),
                        self.tokenizer.decode)
        sampling = SamplingConfig(gen.temperature, gen.top_k, gen.top_p)
        generator = torch.Generator()
        if gen.seed is not None:
            generator.manual_seed(gen.seed)
        else:
            generator.seed()
        deadline = time.monotonic() + self.timeout_s if self.timeout_s else math.inf
        return Job(ids, rule, sampling, gen.n, gen.top_logprobs, prompt_logprobs, generator,
                   deadline)

    def token_info(self, token: int, logprob: float | None,
                   top: TopLogprobs | None) -> api.TokenInfo:
        """A token as the API shows it. Its text is its own decoding until
        :func:`spelled` splits the text it belongs to among its tokens; an alternative
        whose bytes are part of a character is spelled ``bytes:\\xe2\\x80`` (OpenAI's
        way), so that two of them are not both "\ufffd"."""
        text, raw = self._piece(token)
        alts = None if top is None else [(*self._piece(t, spell_bytes=True), lp)
                                         for t, lp in top]
        return api.TokenInfo(text, raw, logprob, alts)

    def _piece(self, token: int, spell_bytes: bool = False) -> tuple[str, list[int]]:
        text = self.tokenizer.decode([token])
        raw = (self.tokenizer.token_bytes(token) if hasattr(self.tokenizer, "token_bytes")
               else text.encode())
        if spell_bytes and "\ufffd" in text and "\ufffd".encode() not in raw:
            text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
        return text, list(raw)


def spelled(tokens: Sequence[api.TokenInfo], text: str) -> list[api.TokenInfo]:
    """``tokens`` with texts that split ``text`` (what they decode to together) among them, so
    that they join to it and each token's offset in it is right: each token its own
    characters, a character whose UTF-8 bytes span tokens given to the token that completes
    it (those before it show ""). The last token takes whatever is left (a text cut before a
    stop string ends inside it). Bytes stay each token's own."""
    utf8 = codecs.getincrementaldecoder("utf-8")("replace")
    out, at = [], 0
    for k, t in enumerate(tokens):
        end = (len(text) if k == len(tokens) - 1
               else min(len(text), at + len(utf8.decode(bytes(t.bytes)))))
        out.append(dataclasses.replace(t, text=text[at:end]))
        at = end
    return out


class Submission:
    """The jobs of one HTTP request and their events as they come back (on the event loop:
    the engine's ``post`` is the loop's ``call_soon_threadsafe``)."""

    def __init__(self, engine: Engine, jobs: list[Job]):
        self.engine, self.jobs = engine, jobs
        self.queue: asyncio.Queue[tuple[int, list]] = asyncio.Queue()
        for i, job in enumerate(jobs):
            job.sink = lambda events, i=i: self.queue.put_nowait((i, events))

    def submit(self) -> None:
        """Queue every job, or none (429 when the queue is full, 503 when stopped)."""
        try:
            for job in self.jobs:
                self.engine.submit(job)
        except QueueFull:
            self.cancel()
            raise api.ApiError(429, "the server is busy: too many requests are waiting; "
                                    "retry later", headers={"Retry-After": "1"}) from None
        except EngineStopped:
            self.cancel()
            raise api.ApiError(503, "the server is shutting down",
                               headers={"Retry-After": "5"}) from None

    def cancel(self) -> None:
        for job in self.jobs:
            self.engine.cancel(job)


def text_of(rule: StopRule, template: ChatTemplate | None) -> StreamText:
    """The text of one choice: a chat reply's (by its ``template``) ends without the start of
    a marker it was writing."""
    return StreamText(rule) if template is None else ReplyText(rule, template)


@dataclass
class Choice:
    """One choice's output so far: released text and tokens, and how it ended."""

    index: int
    stream: StreamText
    logprobs: bool
    text: str = ""
    tokens: list[api.TokenInfo] = field(default_factory=list)
    pending: list[api.TokenInfo] = field(default_factory=list)
    generated: int = 0
    finish: str | None = None

    def add(self, service: Service, ev: TokenOut) -> tuple[str, list[api.TokenInfo]]:
        """Take a token; returns the text and token entries that became final."""
        self.generated += 1
        if self.logprobs:
            self.pending.append(service.token_info(ev.token, ev.logprob, ev.top))
        piece, n = self.stream.add(ev.token)
        if ev.finish is not None:
            return self.end(ev.finish, (piece, n))
        return self._release(piece, n)

    def end(self, finish: str, before: tuple[str, int] = ("", 0)) -> tuple[str,
                                                                          list[api.TokenInfo]]:
        piece, n = self.stream.finish()
        self.finish = finish
        return self._release(before[0] + piece, before[1] + n)

    def _release(self, piece: str, n: int) -> tuple[str, list[api.TokenInfo]]:
        # a piece ends where a token and a character do: its tokens spell it alone
        released = spelled(self.pending[:n], piece) if self.logprobs else []
        self.pending = self.pending[n:]
        self.text += piece
        self.tokens += released
        return piece, released


@dataclass
class Update:
    """Something to tell the client about choice ``index``: new text and token entries, the
    finish reason once it ends."""

    index: int
    text: str
    tokens: list[api.TokenInfo]
    finish: str | None


def merged(updates: Iterable[Update | tuple[int, PromptScores]]
           ) -> Iterator[Update | tuple[int, PromptScores]]:
    """Consecutive updates of a choice as one (text and token entries joined, the last
    finish); prompt scores keep their place before the updates that follow them."""
    held: dict[int, Update] = {}
    for u in updates:
        if isinstance(u, tuple):
            yield from held.values()
            held.clear()
            yield u
            continue
        before = held.get(u.index)
        held[u.index] = u if before is None else Update(
            u.index, before.text + u.text, before.tokens + u.tokens, u.finish)
    yield from held.values()


class Run:
    """One request's jobs in the engine, as a stream of :class:`Update` s."""

    def __init__(self, service: Service, jobs: list[Job], prompt_tokens: int,
                 template: ChatTemplate | None = None):
        """``template``: a chat reply's chat template (see
        :class:`~scratchgpt.serve.reply.ReplyText`)."""
        self.service, self.jobs, self.prompt_tokens = service, jobs, prompt_tokens
        self.sub = Submission(service.engine, jobs)
        self.choices = [[Choice(i * job.n + c, text_of(job.rule, template),
                                job.top_logprobs is not None)
                         for c in range(job.n)] for i, job in enumerate(jobs)]
        self.prompt_scores: dict[int, PromptScores] = {}
        self._early: list[tuple[int, list]] = []
        self.open = sum(job.n for job in jobs)
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def start(self) -> None:
        self.service.metrics.prompt_tokens_in(self.prompt_tokens)
        self.sub.submit()

    def completion_tokens(self) -> int:
        return sum(c.generated for row in self.choices for c in row)

    async def started(self) -> None:
        """Wait for the first events (the first token, usually), so that a request that
        fails before it starts (out of time in the queue) can still answer with its status."""
        item = await self.sub.queue.get()
        self._early.append(item)
        failed = next((ev for ev in item[1] if isinstance(ev, Failed)), None)
        if failed is not None:
            self._apply(item[0], failed)

    async def updates(self) -> AsyncIterator[Update | tuple[int, PromptScores]]:
        """Updates until every choice has ended; a failed job raises its ApiError.

        A client that keeps up gets one update per decode step. When the engine's events
        came faster than they were sent (a busy server), everything waiting is sent at once,
        one update per choice: fewer, larger chunks cost the server and the client less per
        token, so a busy server does not fall further behind."""
        while self.open:
            waiting = [self._early.pop(0) if self._early else await self.sub.queue.get()]
            while not self.sub.queue.empty():
                waiting.append(self.sub.queue.get_nowait())
            for update in merged(u for i, events in waiting for ev in events
                                 for u in self._apply(i, ev)):
                yield update

    def _apply(self, i: int, ev: Any) -> list[Update | tuple[int, PromptScores]]:
        if isinstance(ev, Failed):
            self.sub.cancel()
            raise api.ApiError(ev.status, ev.message, headers={"Retry-After": "1"}
                               if ev.status == 503 else None)
        if isinstance(ev, PromptScores):
            self.prompt_scores[i] = ev
            return [(i, ev)]
        choice = self.choices[i][ev.choice]
        text, tokens = (choice.add(self.service, ev) if isinstance(ev, TokenOut)
                        else choice.end(ev.finish))
        if isinstance(ev, Ended) or ev.finish is not None:
            self.open -= 1
        return [Update(choice.index, text, tokens, choice.finish)]

    def cancel(self) -> None:
        self.sub.cancel()


def encode_all(service: Service, prompts: Sequence[str | list[int]]
               ) -> tuple[list[list[int]], list[str]]:
    pairs = [service.encode(p) for p in prompts]
    return [ids for ids, _ in pairs], [text for _, text in pairs]


# ---- completions


def completion_run(service: Service, req: api.CompletionRequest) -> tuple[Run, list[str]]:
    """The request's run (not started) and its prompts' texts (for ``echo``)."""
    service.check_model(req.model)
    ids, texts = encode_all(service, req.prompts)
    want_scores = req.echo and req.gen.top_logprobs is not None
    jobs = [service.job(p, req.gen, req.gen.stop, want_scores) for p in ids]
    return Run(service, jobs, sum(len(p) for p in ids)), texts


def _echo_tokens(service: Service, job: Job, scores: PromptScores,
                 text: str) -> list[api.TokenInfo]:
    """The prompt's tokens, spelling its echoed ``text`` (an empty prompt's stand-in for the
    start of a text shows "")."""
    return spelled([service.token_info(t, lp, top) for t, lp, top
                    in zip(job.prompt, scores.logprobs, scores.top, strict=True)], text)


async def run_to_end(run: Run) -> None:
    """Start ``run`` and wait until every choice has ended (a non-streaming response); its
    rows leave the batch however this ends (a client gone, a server shutting down)."""
    run.start()
    try:
        async for _ in run.updates():
            pass
    finally:
        run.cancel()


async def complete(service: Service, req: api.CompletionRequest) -> dict[str, Any]:
    """The whole ``text_completion`` response."""
    run, texts = completion_run(service, req)
    await run_to_end(run)
    choices = []
    for i, row in enumerate(run.choices):
        for c in row:
            echo = texts[i] if req.echo else ""
            tokens = c.tokens
            if req.echo and i in run.prompt_scores:
                tokens = _echo_tokens(service, run.jobs[i], run.prompt_scores[i],
                                      texts[i]) + tokens
            lp = api.completion_logprobs(tokens, 0) if c.logprobs else None
            choices.append(api.completion_choice(c.index, echo + c.text, lp, c.finish))
    return api.envelope("text_completion", run.id, run.created, service.info.id, choices,
                        api.usage(run.prompt_tokens, run.completion_tokens()))


def with_null_usage(include_usage: bool, chunk: dict[str, Any]) -> dict[str, Any]:
    """A chunk of a stream that asked for usage: OpenAI's carry ``"usage": null`` until the
    last, which carries the counts."""
    return {**chunk, "usage": None} if include_usage else chunk


async def stream_completion(service: Service, run: Run, texts: list[str], echo: bool,
                            include_usage: bool) -> AsyncIterator[bytes]:
    """Server-sent events of a started completion run, then ``data: [DONE]``."""
    def chunk(index: int, text: str, lp: dict | None, finish: str | None) -> bytes:
        return api.sse(with_null_usage(include_usage, api.envelope(
            "text_completion", run.id, run.created, service.info.id,
            [api.completion_choice(index, text, lp, finish)])))

    offsets = {}
    if echo:  # the prompt first, for each choice (with its scores when asked)
        for i, row in enumerate(run.choices):
            for c in row:
                offsets[c.index] = len(texts[i])
                if not c.logprobs:  # else the prompt comes with its scores, the first event
                    yield chunk(c.index, texts[i], None, None)
    async for u in run.updates():
        if isinstance(u, tuple):
            i, scores = u
            tokens = _echo_tokens(service, run.jobs[i], scores, texts[i])
            for c in run.choices[i]:
                yield chunk(c.index, texts[i], api.completion_logprobs(tokens, 0), None)
            continue
        lp = None
        if run.choices[0][0].logprobs:
            lp = api.completion_logprobs(u.tokens, offsets.get(u.index, 0))
            offsets[u.index] = offsets.get(u.index, 0) + len(u.text)
        if u.text or u.finish or u.tokens:
            yield chunk(u.index, u.text, lp, u.finish)
    if include_usage:
        yield api.sse(api.envelope("text_completion", run.id, run.created, service.info.id, [],
                                   api.usage(run.prompt_tokens, run.completion_tokens())))
    yield api.sse("[DONE]")


# ---- chat


def chat_run(service: Service, req: api.ChatRequest) -> Run:
    """The request's run (not started)."""
    service.check_model(req.model)
    if service.template is None:
        raise api.ApiError(400, f"the model '{service.info.id}' has no chat template (it was "
                                "not fine-tuned for chat); use /v1/completions",
                           param="messages", code="no_chat_template")
    if req.messages[-1]["role"] == "assistant":
        raise api.ApiError(400, "the last message must be the user's (or the system's)",
                           param="messages")
    ids = service.chat_prompt(req.messages)
    job = service.job(ids, req.gen, (*service.template.reply_stops, *req.gen.stop))
    run = Run(service, [job], len(ids), template=service.template)
    run.id = f"chatcmpl-{uuid.uuid4().hex}"
    return run


async def chat(service: Service, req: api.ChatRequest) -> dict[str, Any]:
    """The whole ``chat.completion`` response."""
    run = chat_run(service, req)
    await run_to_end(run)
    choices = [api.chat_choice(c.index, c.text, api.chat_logprobs(c.tokens) if c.logprobs
                               else None, c.finish, delta=False) for c in run.choices[0]]
    return api.envelope("chat.completion", run.id, run.created, service.info.id, choices,
                        api.usage(run.prompt_tokens, run.completion_tokens()),
                        req.service_tier)


async def stream_chat(service: Service, run: Run, include_usage: bool,
                      service_tier: str | None = None) -> AsyncIterator[bytes]:
    """Server-sent events of a started chat run, then ``data: [DONE]``; each chunk names
    ``service_tier`` when given, as OpenAI's chunks name the tier."""
    def chunk(choice: dict) -> bytes:
        return api.sse(with_null_usage(include_usage, api.envelope(
            "chat.completion.chunk", run.id, run.created, service.info.id, [choice],
            service_tier=service_tier)))

    for c in run.choices[0]:
        yield chunk(api.chat_choice(c.index, "", None, None, delta=True, first=True))
    async for u in run.updates():
        if isinstance(u, Update) and (u.text or u.finish or u.tokens):
            lp = api.chat_logprobs(u.tokens) if run.choices[0][0].logprobs else None
            yield chunk(api.chat_choice(u.index, u.text, lp, u.finish, delta=True))
    if include_usage:
        yield api.sse(api.envelope("chat.completion.chunk", run.id, run.created,
                                   service.info.id, [],
                                   api.usage(run.prompt_tokens, run.completion_tokens()),
                                   service_tier))
    yield api.sse("[DONE]")

