"""OpenAI's HTTP API, the parts this server speaks: request checking and response shapes.

Requests are checked field by field against a table per endpoint. A field OpenAI defines that
this server cannot honour (``tools``, a non-zero ``presence_penalty``, ``audio``) and a field
nobody defines are both a 400 naming the field, as OpenAI answers. Fields that change nothing
this server generates (:data:`IGNORED_CHAT_FIELDS`: ``store``, ``metadata``, ``service_tier``,
the ids for OpenAI's caches and abuse checks), which some clients send by default, are checked
for their type and ignored; a chat request that names a ``service_tier`` is answered, as
OpenAI answers it, with the tier that served it: this server's one, :data:`SERVICE_TIER`.
Every error is OpenAI's error object with the HTTP status that
fits::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "top_p",
               "code": null}}

    400 a field is wrong, or the prompt is longer than the server takes (code
        ``context_length_exceeded``, as OpenAI, vLLM and llama.cpp's server answer it)
    401 missing or wrong API key   404 no such model or route     413 the body is too large
    429 the queue is full (Retry-After)
    503 timed out waiting, or shutting down (Retry-After)

Responses are plain dicts in OpenAI's shapes (``text_completion``, ``chat.completion`` and
their ``...chunk`` streaming forms).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scratchgpt.chat import ROLES
from scratchgpt.validation import SEED_MAX
from scratchgpt.wording import plural

ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error",
               404: "invalid_request_error", 405: "invalid_request_error",
               413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error",
               503: "server_error"}


class ApiError(Exception):
    """An error answer: HTTP ``status`` and OpenAI's error object."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": ERROR_TYPES.get(self.status, "error"),
                          "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Limits:
    """What one request may ask for. A body over ``max_body_bytes`` is a 413; a prompt over
    ``max_prompt_tokens`` (code ``context_length_exceeded``), ``max_tokens`` and ``n`` over
    theirs are a 400."""

    max_body_bytes: int = 1 << 20
    max_prompt_tokens: int = 4096
    max_tokens: int = 4096
    max_n: int = 16
    max_logprobs: int = 20
    max_stops: int = 4
    max_stop_chars: int = 256
    max_prompts: int = 16
    default_max_tokens: int = 16  # completions, as OpenAI's
    default_chat_max_tokens: int = 512


@dataclass(frozen=True)
class Generation:
    """How to generate, from the request's fields (validated)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    top_logprobs: int | None = None  # None: no log-probabilities


@dataclass(frozen=True)
class CompletionRequest:
    model: str | None
    prompts: list[str | list[int]]
    echo: bool
    gen: Generation


@dataclass(frozen=True)
class ChatRequest:
    model: str | None
    messages: list[dict[str, str]]
    gen: Generation
    service_tier: str | None = None  # the tier its answer names; None: it names none


# The service tier every request is served with. OpenAI's chat answer names the tier that
# served a request that gave a ``service_tier`` ("auto" is answered with the tier it chose,
# "default" unless a project says otherwise), and none otherwise; this server has one tier.
SERVICE_TIER = "default"


# ---- parsing


def parse_json(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object (400 otherwise)."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    except RecursionError:  # Python's parser recurses once per level of nesting
        raise ApiError(400, "the request body nests arrays or objects too deeply") from None
    except ValueError:  # an integer longer than Python converts (4300 digits)
        raise ApiError(400, "the request body holds a number with too many digits") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:  # JSON may escape a lone surrogate (\ud800), which no text encoding can hold
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, "the request body holds an invalid character (a lone UTF-16 "
                            "surrogate)") from None
    return data


def _bad(name: str, what: str) -> ApiError:
    return ApiError(400, f"'{name}' must be {what}", param=name)


def _int(lo: int | None = None, hi: int | None = None) -> Callable[[str, Any], int]:
    def check(name: str, v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise _bad(name, "an integer")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            bounds = f">= {lo}" if hi is None else f"between {lo} and {hi}"
            raise _bad(name, f"an integer {bounds}, got {v}")
        return v
    return check


def _number(lo: float, hi: float, open_low: bool = False) -> Callable[[str, Any], float]:
    def check(name: str, v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise _bad(name, "a number")
        if v > hi or v < lo or (open_low and v == lo):
            low = "(" if open_low else "["
            raise _bad(name, f"in {low}{lo}, {hi}], got {v}")
        return float(v)
    return check


def _bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise _bad(name, "true or false")
    return v


def _string(name: str, v: Any) -> str:
    if not isinstance(v, str):
        raise _bad(name, "a string")
    return v


def _zero_only(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or v != 0:
        raise ApiError(400, f"'{name}' is not supported by this server (only 0)", param=name)
    return 0.0


def _one_only(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v != 1:
        raise ApiError(400, f"'{name}' is not supported by this server (only 1)", param=name)
    return 1


def _empty_only(name: str, v: Any) -> None:
    if v not in ({}, []):
        raise ApiError(400, f"'{name}' is not supported by this server", param=name)


def _unsupported(name: str, v: Any) -> None:
    raise ApiError(400, f"'{name}' is not supported by this server", param=name)


def _text_format(name: str, v: Any) -> None:
    if not (isinstance(v, dict) and v.get("type") == "text"):
        raise ApiError(400, f"'{name}': only {{\"type\": \"text\"}} is supported", param=name)


def _stream_options(name: str, v: Any) -> bool:
    """Whether to send usage; ``include_obfuscation`` (OpenAI's padding of chunks against
    side channels) is taken and ignored: no chunk carries an ``obfuscation`` field."""
    if not isinstance(v, dict) or set(v) - {"include_usage", "include_obfuscation"}:
        raise _bad(name, 'an object {"include_usage": true|false, "include_obfuscation": '
                         'true|false}')
    if v.get("include_obfuscation") is not None:
        _bool(f"{name}.include_obfuscation", v["include_obfuscation"])
    return _bool(f"{name}.include_usage", v.get("include_usage", False))


def _metadata(name: str, v: Any) -> None:
    """OpenAI's ``metadata``: up to 16 pairs of strings (keys up to 64 characters, values
    up to 512)."""
    if not (isinstance(v, dict) and len(v) <= 16 and all(
            isinstance(k, str) and len(k) <= 64 and isinstance(x, str) and len(x) <= 512
            for k, x in v.items())):
        raise _bad(name, "an object of at most 16 string values (keys of at most 64 "
                         "characters, values of at most 512)")


def _text_modalities(name: str, v: Any) -> None:
    if v != ["text"]:
        raise ApiError(400, f"'{name}': only [\"text\"] is supported", param=name)


def _stop(name: str, v: Any) -> tuple[str, ...]:
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise _bad(name, "a non-empty string or a list of them")
    return tuple(stops)


def _prompt(name: str, v: Any) -> list[str | list[int]]:
    """A string, a list of strings, a list of token ids, or a list of lists of ids."""
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool)
                                         for t in v):
        return [list(v)]
    if isinstance(v, list) and v and all(isinstance(p, str) for p in v):
        return list(v)
    if isinstance(v, list) and v and all(isinstance(p, list) and p and all(
            isinstance(t, int) and not isinstance(t, bool) for t in p) for p in v):
        return [list(p) for p in v]
    raise _bad(name, "a string, a list of strings, a list of token ids or a list of lists "
                     "of token ids (none empty)")


def _token_ids(name: str, v: Any) -> list[int]:
    """One prompt's token ids: a non-empty list of integers."""
    if not (isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool)
                                              for t in v)):
        raise _bad(name, "a non-empty list of token ids")
    return list(v)


def _role(where: str, m: Any) -> str:
    """A message's role; OpenAI's ``developer`` (its newer models' name for the system
    message) is the system message."""
    if not isinstance(m, dict) or m.get("role") is None:
        raise ApiError(400, f"'{where}' needs a 'role', one of {', '.join(ROLES)}",
                       param=where)
    role = "system" if m["role"] == "developer" else m["role"]
    if role not in ROLES:
        raise ApiError(400, f"'{where}': the role {m['role']!r} is not supported by this "
                            f"server; roles are {', '.join(ROLES)}", param=where)
    return role


def _messages(name: str, v: Any) -> list[dict[str, str]]:
    if not isinstance(v, list) or not v:
        raise _bad(name, "a non-empty list of messages")
    out = []
    for i, m in enumerate(v):
        where = f"{name}[{i}]"
        role = _role(where, m)
        content = m.get("content")
        if isinstance(content, list):  # content parts: text parts only
            if not all(isinstance(p, dict) and p.get("type") == "text"
                       and isinstance(p.get("text"), str) for p in content):
                raise ApiError(400, f"'{where}.content': only text parts are supported",
                               param=where)
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise ApiError(400, f"'{where}' needs a text 'content'", param=where)
        out.append({"role": role, "content": content})
    return out


Check = Callable[[str, Any], Any]
COMMON: dict[str, Check] = {
    "model": _string, "max_tokens": _int(1), "temperature": _number(0.0, 2.0),
    # top_k: 0, and vLLM's -1, keep every token (as a top_k of the vocabulary or more does)
    "top_p": _number(0.0, 1.0, open_low=True), "top_k": _int(-1), "stop": _stop,
    "seed": _int(0, SEED_MAX), "n": _int(1), "stream": _bool, "stream_options": _stream_options,
    "user": _string, "presence_penalty": _zero_only, "frequency_penalty": _zero_only,
    "logit_bias": _empty_only,
}
COMPLETION_FIELDS: dict[str, Check] = {
    # max_tokens 0 scores a prompt: taken with echo only (parse_completion)
    **COMMON, "max_tokens": _int(0), "prompt": _prompt, "logprobs": _int(0), "echo": _bool,
    "best_of": _one_only, "suffix": _unsupported,
}
# chat fields that change nothing this server generates: checked for their type, ignored
# (nothing is stored; there is one service tier, no prompt cache to key, no abuse checks);
# a service_tier given is answered with the one tier (SERVICE_TIER)
IGNORED_CHAT_FIELDS: dict[str, Check] = {
    "store": _bool, "metadata": _metadata, "service_tier": _string,
    "prompt_cache_key": _string, "prompt_cache_retention": _string,
    "safety_identifier": _string, "parallel_tool_calls": _bool,
}
CHAT_FIELDS: dict[str, Check] = {
    **COMMON, **IGNORED_CHAT_FIELDS, "messages": _messages, "logprobs": _bool,
    "top_logprobs": _int(0), "max_completion_tokens": _int(1), "response_format": _text_format,
    "modalities": _text_modalities, "tools": _unsupported, "tool_choice": _unsupported,
    "functions": _unsupported, "function_call": _unsupported, "audio": _unsupported,
    "prediction": _unsupported, "reasoning_effort": _unsupported, "verbosity": _unsupported,
    "web_search_options": _unsupported,
}

ATTENTION_FIELDS: dict[str, Check] = {  # the playground's /api/attention
    "text": _string, "tokens": _token_ids, "layer": _int(0), "head": _int(0),
}


def check_fields(data: Mapping[str, Any], table: Mapping[str, Check]) -> dict[str, Any]:
    """Each field through its check; absent and null fields become None."""
    unknown = sorted(set(data) - set(table))
    if unknown:
        raise ApiError(400, f"Unrecognized request argument supplied: {', '.join(unknown)}",
                       param=unknown[0])
    return {name: (None if data.get(name) is None else check(name, data[name]))
            for name, check in table.items()}


def _sent(f: dict[str, Any], name: str, other: str) -> str:
    """``name`` if the request gave it (a chat field that takes the place of ``other``), else
    ``other``: the field an error names."""
    return name if f.get(name) is not None else other


def _generation(f: dict[str, Any], limits: Limits, max_tokens: int | None, default: int,
                top_logprobs: int | None) -> Generation:
    n = 1 if f["n"] is None else f["n"]
    if n > limits.max_n:
        raise ApiError(400, f"'n' must be at most {limits.max_n}, got {n}", param="n")
    # a request that names no max_tokens gets the default, within the server's limit
    max_tokens = min(default, limits.max_tokens) if max_tokens is None else max_tokens
    if max_tokens > limits.max_tokens:
        name = _sent(f, "max_completion_tokens", "max_tokens")
        raise ApiError(400, f"'{name}' must be at most {limits.max_tokens}, got "
                            f"{max_tokens}", param=name)
    if top_logprobs is not None and top_logprobs > limits.max_logprobs:
        raise ApiError(400, f"at most {limits.max_logprobs} top log-probabilities, got "
                            f"{top_logprobs}", param=_sent(f, "top_logprobs", "logprobs"))
    stop = f["stop"] or ()
    if len(stop) > limits.max_stops or any(len(s) > limits.max_stop_chars for s in stop):
        raise ApiError(400, f"'stop': at most {limits.max_stops} strings of at most "
                            f"{limits.max_stop_chars} characters", param="stop")
    if f["stream_options"] is not None and not f["stream"]:
        raise ApiError(400, "'stream_options' needs 'stream': true", param="stream_options")
    top_k = f["top_k"] if f["top_k"] and f["top_k"] > 0 else None
    return Generation(max_tokens=max_tokens,
                      temperature=1.0 if f["temperature"] is None else f["temperature"],
                      top_p=f["top_p"], top_k=top_k, stop=stop, seed=f["seed"], n=n,
                      stream=bool(f["stream"]), include_usage=bool(f["stream_options"]),
                      top_logprobs=top_logprobs)


def parse_completion(data: Mapping[str, Any], limits: Limits) -> CompletionRequest:
    """A ``POST /v1/completions`` body, checked. ``max_tokens`` 0 with ``echo`` is OpenAI's
    way to score a prompt: the prompt comes back (with its tokens' log-probabilities when
    ``logprobs`` is given) and nothing is generated; without ``echo`` it is refused."""
    f = check_fields(data, COMPLETION_FIELDS)
    if f["max_tokens"] == 0 and not f["echo"]:  # nothing to answer: refused as in chat
        COMMON["max_tokens"]("max_tokens", 0)
    prompts = f["prompt"] if f["prompt"] is not None else [""]
    if len(prompts) > limits.max_prompts:
        raise ApiError(400, f"at most {plural(limits.max_prompts, 'prompt')} per request, "
                            f"got {len(prompts)}", param="prompt")
    gen = _generation(f, limits, f["max_tokens"], limits.default_max_tokens, f["logprobs"])
    if len(prompts) * gen.n > limits.max_n:
        raise ApiError(400, f"prompts x n = {len(prompts) * gen.n} exceeds {limits.max_n} "
                            "sequences per request", param="n")
    return CompletionRequest(f["model"], prompts, bool(f["echo"]), gen)


def parse_chat(data: Mapping[str, Any], limits: Limits) -> ChatRequest:
    """A ``POST /v1/chat/completions`` body, checked."""
    f = check_fields(data, CHAT_FIELDS)
    if f["messages"] is None:
        raise ApiError(400, "'messages' is required", param="messages")
    if f["top_logprobs"] is not None and not f["logprobs"]:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    top = (f["top_logprobs"] or 0) if f["logprobs"] else None
    max_tokens = f["max_completion_tokens"] or f["max_tokens"]
    gen = _generation(f, limits, max_tokens, limits.default_chat_max_tokens, top)
    tier = None if f["service_tier"] is None else SERVICE_TIER  # (any tier asked: the one)
    return ChatRequest(f["model"], f["messages"], gen, tier)


# ---- responses


@dataclass(frozen=True)
class TokenInfo:
    """A generated (or echoed) token as the API shows it: its text, bytes, log-probability
    and the most likely alternatives ((text, bytes, log-probability))."""

    text: str
    bytes: list[int]
    logprob: float | None
    top: list[tuple[str, list[int], float]] | None


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_logprobs(tokens: Sequence[TokenInfo], offset: int) -> dict[str, Any]:
    """The ``logprobs`` object of a completion choice (``offset``: where the first token's
    text begins in the choice's text)."""
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t.text)
    return {"tokens": [t.text for t in tokens],
            "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [None if t.top is None else {text: lp for text, _, lp in t.top}
                             for t in tokens],
            "text_offset": offsets}


def chat_logprobs(tokens: Sequence[TokenInfo]) -> dict[str, Any]:
    """The ``logprobs`` object of a chat choice."""
    return {"content": [
        {"token": t.text, "logprob": t.logprob, "bytes": t.bytes,
         "top_logprobs": [{"token": text, "logprob": lp, "bytes": b}
                          for text, b, lp in (t.top or [])]}
        for t in tokens]}


def completion_choice(index: int, text: str, logprobs: dict | None,
                      finish: str | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}


def chat_choice(index: int, text: str, logprobs: dict | None, finish: str | None,
                delta: bool, first: bool = False) -> dict[str, Any]:
    """A chat choice: the whole ``message``, or a streaming ``delta`` (the first delta of a
    choice says the role)."""
    if delta:
        body: dict[str, Any] = {"role": "assistant", "content": text} if first else (
            {"content": text} if text or finish is None else {})
        return {"index": index, "delta": body, "logprobs": logprobs, "finish_reason": finish}
    return {"index": index, "message": {"role": "assistant", "content": text},
            "logprobs": logprobs, "finish_reason": finish}


def envelope(kind: str, rid: str, created: int, model: str, choices: list[dict],
             usage_: dict | None = None, service_tier: str | None = None) -> dict[str, Any]:
    """A response or chunk: ``kind`` is its ``object`` (``text_completion``,
    ``chat.completion``, ``chat.completion.chunk``); ``service_tier``, when given, the tier
    that served it (a chat response or chunk, as OpenAI's)."""
    body = {"id": rid, "object": kind, "created": created, "model": model, "choices": choices}
    if usage_ is not None:
        body["usage"] = usage_
    if service_tier is not None:
        body["service_tier"] = service_tier
    return body


def sse(data: Mapping[str, Any] | str) -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()
