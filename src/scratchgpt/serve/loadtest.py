"""Clients that load a running server: many concurrent streams, and a soak of mixed requests.

    result = asyncio.run(load(url, requests, clients=16))   # LoadResult: tokens/s, TTFT, ITL
    report = asyncio.run(soak(url, 2000, clients=32))       # SoakReport: statuses by kind

Every client is an ``httpx.AsyncClient`` stream on 127.0.0.1; counts and times are bounded by
the caller (``time_limit_s`` stops issuing new requests). ``load`` streams each request
(``stream_options.include_usage`` gives the exact token count) and records the time to the
first token and every gap between chunks. ``soak`` mixes good and bad requests and checks that
each gets the status it should: good ones 200, malformed or unknown fields 400, over-long
prompts 400 (``context_length_exceeded``, as OpenAI answers them), bodies over the byte limit
413, and clients that hang up mid-stream; any 5xx is a failure.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Timing:
    """One streamed request: status, seconds to the first token, gaps between chunks, tokens."""

    status: int
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` percentile (0 < q <= 100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


@dataclass
class LoadResult:
    clients: int
    requests: int
    seconds: float
    tokens: int
    ttft: list[float]
    gaps: list[float]
    statuses: Counter

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def summary(self) -> dict[str, Any]:
        return {"clients": self.clients, "requests": self.requests,
                "seconds": round(self.seconds, 3), "tokens": self.tokens,
                "tokens_per_s": round(self.tokens_per_s, 2),
                "ttft_p50_s": round(percentile(self.ttft, 50), 4),
                "ttft_p99_s": round(percentile(self.ttft, 99), 4),
                "itl_p50_s": round(percentile(self.gaps, 50), 4),
                "itl_p99_s": round(percentile(self.gaps, 99), 4),
                "statuses": dict(self.statuses)}


async def sse_data(response: Any):
    """The ``data:`` payloads of a server-sent event stream, as they arrive."""
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            yield line[6:]


async def timed_stream(client: Any, path: str, body: dict[str, Any]) -> Timing:
    """POST a streaming request; time its chunks."""
    start = time.perf_counter()
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return Timing(response.status_code)
        timing, last = Timing(200), None
        async for data in sse_data(response):
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            now = time.perf_counter()
            if chunk.get("usage"):
                timing.tokens = chunk["usage"]["completion_tokens"]
            if chunk["choices"]:
                if last is None:
                    timing.ttft = now - start
                else:
                    timing.gaps.append(now - last)
                last = now
        return timing


async def load(url: str, bodies: list[dict[str, Any]], clients: int, path: str = "/v1/completions",
               time_limit_s: float = 600.0, headers: dict[str, str] | None = None) -> LoadResult:
    """Send ``bodies`` as streaming requests from ``clients`` concurrent clients (each takes the
    next request when its last one is done) until all are sent or the time limit is up."""
    import httpx

    pending = list(reversed(bodies))
    timings: list[Timing] = []
    start = time.perf_counter()

    async def client_loop(client: Any) -> None:
        while pending and time.perf_counter() - start < time_limit_s:
            timings.append(await timed_stream(client, path, pending.pop()))

    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=time_limit_s + 60, limits=limits,
                                 headers=headers) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
    seconds = time.perf_counter() - start
    return LoadResult(clients, len(timings), seconds, sum(t.tokens for t in timings),
                      [t.ttft for t in timings if t.ttft is not None],
                      [g for t in timings for g in t.gaps], Counter(t.status for t in timings))


# ---- the soak


@dataclass
class SoakReport:
    """What a soak saw: statuses by kind of request, and those that were not as expected."""

    requests: int = 0
    seconds: float = 0.0
    by_kind: dict[str, Counter] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)

    @property
    def server_errors(self) -> int:
        return sum(n for c in self.by_kind.values() for s, n in c.items()
                   if isinstance(s, int) and s >= 500)

    def record(self, kind: str, status: int | str, ok: bool) -> None:
        self.requests += 1
        self.by_kind.setdefault(kind, Counter())[status] += 1
        if not ok and len(self.unexpected) < 20:
            self.unexpected.append(f"{kind}: {status}")


@dataclass(frozen=True)
class SoakSetup:
    """What the soak knows of the server: a prompt text the tokenizer takes, the longest
    prompt in tokens, the body limit, and whether the model can chat."""

    words: list[str]
    max_prompt_tokens: int
    max_body_bytes: int
    chat: bool


Kind = Callable[[Any, random.Random, SoakSetup], Any]


def _prompt(rng: random.Random, setup: SoakSetup, n_words: int = 6) -> str:
    return " ".join(rng.choice(setup.words) for _ in range(rng.randint(1, n_words)))


def _sampling(rng: random.Random) -> dict[str, Any]:
    return rng.choice([{"temperature": 0}, {"temperature": 0.8, "top_p": 0.9},
                       {"temperature": 1.0, "top_k": 5, "seed": rng.randint(0, 99)}])


async def _status_of(client: Any, path: str, **kwargs: Any) -> int:
    response = await client.post(path, **kwargs)
    return response.status_code


async def good_completion(client: Any, rng: random.Random, setup: SoakSetup) -> int:
    body = {"prompt": _prompt(rng, setup), "max_tokens": rng.randint(1, 24), **_sampling(rng),
            "n": rng.choice([1, 1, 2, 3]), "logprobs": rng.choice([None, 2]),
            "echo": rng.random() < 0.2}
    if rng.random() < 0.3:
        body["stop"] = [rng.choice("etaoin ")]
    if rng.random() < 0.5:
        return (await timed_stream(client, "/v1/completions", body)).status
    return await _status_of(client, "/v1/completions", json=body)


async def good_chat(client: Any, rng: random.Random, setup: SoakSetup) -> int:
    body = {"messages": [{"role": "user", "content": _prompt(rng, setup)}],
            "max_tokens": rng.randint(1, 16), **_sampling(rng), "n": rng.choice([1, 2]),
            "stop": rng.choice([None, ["e"]])}
    if rng.random() < 0.5:
        return (await timed_stream(client, "/v1/chat/completions", body)).status
    return await _status_of(client, "/v1/chat/completions", json=body)


async def malformed_json(client: Any, rng: random.Random, setup: SoakSetup) -> int:
    body = rng.choice(['{"prompt": "a", ', "[1, 2]", "not json", '{"prompt": "\\ud800x"}',
                       '{"max_tokens": "ten"}'])
    return await _status_of(client, "/v1/completions", content=body.encode(),
                            headers={"Content-Type": "application/json"})


async def unknown_field(client: Any, rng: random.Random, setup: SoakSetup) -> int:
    body = {"prompt": _prompt(rng, setup), "max_tokens": 4, f"x_{rng.randint(0, 9)}": 1}
    return await _status_of(client, "/v1/completions", json=body)


async def too_long(client: Any, rng: random.Random, setup: SoakSetup) -> int | str:
    """A prompt of more tokens than the server takes: its status, or status and error code
    where the code is not OpenAI's ``context_length_exceeded``."""
    ids = [rng.randrange(2) for _ in range(setup.max_prompt_tokens + 1)]
    response = await client.post("/v1/completions", json={"prompt": ids})
    if response.status_code != 400:
        return response.status_code
    code = response.json()["error"]["code"]
    return 400 if code == "context_length_exceeded" else f"400 {code}"


async def too_big(client: Any, rng: random.Random, setup: SoakSetup) -> int:
    """A body of more bytes than the server reads."""
    return await _status_of(client, "/v1/completions", json={
        "prompt": "a" * (setup.max_body_bytes + 1)})


async def hang_up(client: Any, rng: random.Random, setup: SoakSetup) -> str:
    """Read a couple of chunks of a long stream, then close the connection."""
    body = {"prompt": _prompt(rng, setup), "max_tokens": 400, "stream": True,
            "temperature": 1.0}
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            return str(response.status_code)
        seen = 0
        async for _ in sse_data(response):
            seen += 1
            if seen >= 2:
                break
    return "hung up"


# kind -> (how to send it, the statuses it should get)
KINDS: dict[str, tuple[Kind, set]] = {
    "completion": (good_completion, {200}),
    "chat": (good_chat, {200}),
    "malformed_json": (malformed_json, {400}),
    "unknown_field": (unknown_field, {400}),
    "too_long": (too_long, {400}),
    "too_big": (too_big, {413}),
    "hang_up": (hang_up, {"hung up"}),
}
MIX = ("completion",) * 8 + ("chat",) * 3 + ("malformed_json", "unknown_field", "too_long",
                                             "too_big", "hang_up", "hang_up")


async def soak(url: str, requests: int, clients: int, setup: SoakSetup, seed: int = 0,
               time_limit_s: float = 1800.0, headers: dict[str, str] | None = None) -> SoakReport:
    """``requests`` mixed requests (:data:`MIX`) from ``clients`` concurrent clients."""
    import httpx

    rng = random.Random(seed)
    plan = [rng.choice(MIX) for _ in range(requests)]
    report = SoakReport()
    start = time.perf_counter()

    async def client_loop(i: int) -> None:
        crng = random.Random(seed * 1000 + i)
        async with httpx.AsyncClient(base_url=url, timeout=120, headers=headers) as client:
            while plan and time.perf_counter() - start < time_limit_s:
                kind = plan.pop()
                send, expected = KINDS[kind]
                if kind == "chat" and not setup.chat:
                    expected = {400}  # a model without a chat template refuses chat
                try:
                    status = await send(client, crng, setup)
                except httpx.HTTPError as e:
                    status = f"client error {type(e).__name__}"
                report.record(kind, status, status in expected)

    await asyncio.gather(*(client_loop(i) for i in range(clients)))
    report.seconds = time.perf_counter() - start
    return report
