"""Serving throughput: N concurrent streaming clients against the same requests one at a time.

Starts ``scratchgpt serve`` in a child process on 127.0.0.1 (a free port) with a checkpoint, or
with random weights of a model shape (``--shape cpu-small``: the cpu-small preset with a
65-character vocabulary; ``--shape gpt2``: GPT-2 124M with GPT-2's tokenizer, which needs the
``hf`` extra). The workload is ``--requests`` greedy streaming completions of random token-id
prompts (``--prompt-tokens``, ``--max-tokens`` each), sent first one at a time, then from
``--clients`` concurrent clients (each sends its next request when its last one is done).
Reported for both: aggregate tokens/s (completion tokens / wall time), time to first token
(p50, p99) and inter-token latency (gaps between streamed chunks, p50, p99), and the speedup.

``--engine-only`` runs the same workload through the batching engine in this process (one row
at a time, then up to ``--clients`` rows), with no HTTP: the gap between its speedup and the
served one is what streaming over HTTP costs on the same cores.

``--soak`` runs the robustness soak instead: ``--soak-requests`` mixed requests (good
completions and chats with sampling, n > 1, stop strings, logprobs; malformed JSON, unknown
fields, over-long prompts and bodies, clients that hang up mid-stream) from ``--soak-clients``
clients. It passes with zero 5xx answers, every request answered as it should be, the queue
and batch empty afterwards, and the server's memory no more than 10% above where it was after
a warm-up (a leak grows it; less is memory given back). Exit code 1 if not.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from scratchgpt.bench import JsonOutput, add_json_argument, bench_threads
from scratchgpt.commands.argtypes import positive_int
from scratchgpt.validation import flag_of

CHARS_65 = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", default=None, help="serve this run instead of a random model")
    p.add_argument("--shape", default="cpu-small",
                   help="random-weight model when no checkpoint: cpu-small (default), gpt2 "
                        "(124M, GPT-2's tokenizer), or another train preset's name")
    p.add_argument("--dtype", choices=("fp32", "bf16", "int8"), default="fp32",
                   help="the server's inference precision, as serve --dtype (default fp32)")
    p.add_argument("--threads", type=bench_threads, default=0,
                   help="the server's torch threads (default 0: torch's default)")
    p.add_argument("--clients", type=int, default=16, help="concurrent clients (16)")
    p.add_argument("--requests", type=int, default=32, help="requests per phase (32)")
    p.add_argument("--prompt-tokens", type=int, default=32, help="prompt length (32)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per request (64)")
    p.add_argument("--time-limit", type=float, default=600.0,
                   help="seconds per phase: no new request after that (600)")
    p.add_argument("--no-sequential", action="store_true",
                   help="skip the one-at-a-time baseline")
    p.add_argument("--soak", action="store_true", help="run the soak instead (see above)")
    p.add_argument("--soak-requests", type=positive_int, default=2000,
                   help="requests in the soak (2000)")
    p.add_argument("--soak-clients", type=positive_int, default=32,
                   help="concurrent clients in the soak (32)")
    p.add_argument("--url", default=None,
                   help="load this running server (http://127.0.0.1:PORT, or its API's "
                        "address .../v1) instead of starting one (no memory figures then)")
    p.add_argument("--engine-only", action="store_true",
                   help="the same workload through the batching engine in this process, no "
                        "HTTP: what serving costs on top of the model")
    add_json_argument(p)


# ---- the server under test


def write_random_run(shape: str, out: Path) -> None:
    """A checkpoint of random weights with a tokenizer, for timing."""
    import torch

    from scratchgpt.checkpoints import Checkpoint, save_checkpoint
    from scratchgpt.models import build_model, config_fields, model_config, model_type
    from scratchgpt.tokenizers import build_tokenizer
    from scratchgpt.tokenizers.char import CharTokenizer
    from scratchgpt.training.config import PRESETS

    torch.manual_seed(0)
    if shape == "gpt2":
        tok = build_tokenizer("gpt2", "")
        cfg = model_config("gpt", vocab_size=tok.vocab_size, block_size=1024, n_layer=12,
                           n_head=12, n_embd=768)
    elif shape in PRESETS:
        preset = PRESETS[shape]
        tok = CharTokenizer(list(CHARS_65))
        fields = config_fields(preset["model"]) - {"vocab_size"}
        cfg = model_config(preset["model"], vocab_size=tok.vocab_size,
                           **{k: v for k, v in preset.items() if k in fields})
    else:
        from scratchgpt.errors import ConfigError

        raise ConfigError(f"--shape: cpu-small, gpt2 or a preset ({', '.join(PRESETS)}), got "
                          f"{shape!r}")
    out.mkdir(parents=True, exist_ok=True)
    tok.save(out)  # GPT-2's BPE keeps its merges in a file beside the checkpoint
    save_checkpoint(out / "best.pt", Checkpoint(model_type(cfg), cfg, build_model(cfg).state_dict(),
                                                {"text": tok.state()}))


class ServerProcess:
    """``scratchgpt serve`` in a child process: ``with ServerProcess(run, args) as s: s.url``."""

    def __init__(self, checkpoint: str, args: argparse.Namespace):
        self.cmd = [sys.executable, "-m", "scratchgpt", "serve", "--checkpoint", checkpoint,
                    "--port", "0", "--no-access-log", "--dtype", args.dtype,
                    "--threads", str(args.threads),
                    "--max-batch", str(max(args.clients, args.soak_clients) * 3),
                    "--max-queue", "1024"]
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> ServerProcess:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        try:
            self._started()
        except BaseException:  # Ctrl-C or SIGTERM while it starts: no server left behind
            self.__exit__()
            raise
        return self

    def _started(self) -> None:
        """Wait until the child serves (its address read from what it prints), or raise."""
        said: deque[str] = deque(maxlen=5)
        for line in self.proc.stdout:
            said.append(line.strip())
            found = re.search(r"on (http://[\d.]+:\d+)", line)
            if found:
                self.url = found.group(1)
                break
        if not self.url:
            self.proc.wait()
            from scratchgpt.errors import ConfigError

            last = next((line for line in reversed(said) if line), "no output")
            raise ConfigError(f"the server did not start ({last})")
        # keep reading its output (its last lines are shown if it fails), so that a full pipe
        # never blocks it
        self.log: deque[str] = deque(maxlen=50)
        threading.Thread(target=self.log.extend, args=(self.proc.stdout,), daemon=True).start()
        wait_healthy(self.url)

    def rss_bytes(self) -> int:
        return rss_bytes(self.proc.pid)

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def wait_healthy(url: str, timeout_s: float = 60.0) -> dict[str, Any]:
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            r = httpx.get(url + "/health", timeout=5)
            if r.status_code == 200:
                return r.json()
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not become healthy")
        time.sleep(0.1)


def wait_idle(url: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """/health once the queue and the batch are empty (or the last answer at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        health = wait_healthy(url)
        if (health["queue_depth"], health["batch_rows"]) == (0, 0) or (
                time.monotonic() > deadline):
            return health
        time.sleep(0.1)


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux /proc), 0 where unknown."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# ---- throughput


def random_prompts(vocab_size: int, args: argparse.Namespace) -> list[list[int]]:
    """``--requests`` prompts of ``--prompt-tokens`` random token ids, the same every run."""
    rng = random.Random(0)
    return [[rng.randrange(vocab_size - 1) for _ in range(args.prompt_tokens)]
            for _ in range(args.requests)]


def model_card(url: str) -> dict[str, Any]:
    """The served model's entry in the server's ``/v1/models``."""
    import httpx

    return httpx.get(url + "/v1/models", timeout=10).json()["data"][0]


def workload(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The requests: random token-id prompts, greedy, a fixed number of new tokens (prompts
    the server would refuse are a ConfigError: there would be nothing to time)."""
    import httpx

    from scratchgpt.errors import ConfigError

    card = model_card(url)
    limits = httpx.get(url + "/api/limits", timeout=10).json()
    for flag, most in (("prompt_tokens", limits["max_prompt_tokens"]),
                       ("max_tokens", limits["max_tokens"])):
        if getattr(args, flag) > most:
            raise ConfigError(f"{flag_of(flag)} {getattr(args, flag)}: the server "
                              f"takes at most {most} tokens")
    return [{"model": card["id"], "prompt": prompt, "max_tokens": args.max_tokens,
             "temperature": 0} for prompt in random_prompts(card["vocab_size"], args)]


def throughput(url: str, args: argparse.Namespace,
               out: dict[str, Any] | None = None) -> dict[str, Any]:
    """Both phases' figures, each put in ``out`` as it ends (what a Ctrl-C leaves)."""
    from scratchgpt.serve.loadtest import load

    bodies = workload(url, args)
    asyncio.run(load(url, bodies[:2], 1))  # warm up
    out = {} if out is None else out
    if not args.no_sequential:
        out["one_at_a_time"] = answered(asyncio.run(load(url, bodies, 1,
                                                         time_limit_s=args.time_limit)))
    out["concurrent"] = answered(asyncio.run(load(url, bodies, args.clients,
                                                  time_limit_s=args.time_limit)))
    if "one_at_a_time" in out and out["one_at_a_time"]["tokens_per_s"]:
        out["speedup"] = round(out["concurrent"]["tokens_per_s"]
                               / out["one_at_a_time"]["tokens_per_s"], 2)
    return out


def answered(result: Any) -> dict[str, Any]:
    """The summary of a load whose every request was answered; a GenerationError otherwise
    (its figures would time refusals, not the workload)."""
    from scratchgpt.errors import GenerationError

    summary = result.summary()
    failed = {status: n for status, n in summary["statuses"].items() if status != 200}
    if failed:
        raise GenerationError(f"{sum(failed.values())} of {summary['requests']} requests failed "
                           f"(HTTP status: count {failed}); no figures")
    if not summary["requests"]:  # its row was 0 tokens/s and nan for every time
        raise GenerationError("no request was sent before the --time-limit was up; no figures")
    return summary


def engine_throughput(checkpoint: str, args: argparse.Namespace,
                      out: dict[str, Any] | None = None) -> dict[str, Any]:
    """The workload through ``ContinuousBatch`` alone: one request at a time, then up to
    ``--clients`` rows at once (a finished request's place goes to the next, as the clients
    do), as the server's engine runs it but with no HTTP, JSON or event loop. Each figure is
    put in ``out`` as it is measured (what a Ctrl-C leaves)."""
    from scratchgpt.serve.server import ServeConfig, load_service

    # the model as `scratchgpt serve` loads it (threads, dtype, decode preparation)
    service = load_service(ServeConfig(checkpoint, dtype=args.dtype, threads=args.threads))
    model = service.engine.batch.model
    prompts = random_prompts(model.config.vocab_size, args)
    out = {} if out is None else out
    engine_run(model, prompts, args.clients, args.max_tokens)  # warm up
    n_one, one = engine_run(model, prompts, 1, args.max_tokens)
    out.update({"engine_one_at_a_time_tokens_per_s": round(one, 1), "clients": args.clients,
                "tokens": [n_one]})
    n_many, many = engine_run(model, prompts, args.clients, args.max_tokens)
    out.update({"engine_concurrent_tokens_per_s": round(many, 1),
                "engine_speedup": round(many / one, 2), "tokens": [n_one, n_many]})
    return out


def engine_run(model: Any, prompts: list[list[int]], rows: int,
               max_tokens: int) -> tuple[int, float]:
    """(tokens generated, tokens/s) of ``prompts`` through ``ContinuousBatch``, with up to
    ``rows`` rows at once."""
    import torch

    from scratchgpt.generation.stopping import StopRule
    from scratchgpt.serve.batch import ContinuousBatch, Deliveries, Job, TokenOut

    batch, waiting = ContinuousBatch(model), [Job(p, StopRule(max_tokens)) for p in prompts]
    tokens, start = 0, time.perf_counter()
    with torch.inference_mode():
        while waiting or batch.rows:
            out, joining = Deliveries(), waiting[:rows - batch.size]
            del waiting[:len(joining)]
            if joining:
                batch.admit(joining, out)
            for _, events in (*out.items(), *batch.step().items()):
                tokens += sum(isinstance(e, TokenOut) for e in events)
    return tokens, tokens / (time.perf_counter() - start)


def clients_label(n: int) -> str:
    """``n clients``, or ``1 client`` (the report said '1 clients' of --clients 1)."""
    return f"{n} client{'' if n == 1 else 's'}"


def print_throughput(result: dict[str, Any]) -> None:
    print(f"{'':16}{'tokens/s':>10}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>10}"
          f"{'ITL p99':>10}{'requests':>10}{'tokens':>8}")
    for name in ("one_at_a_time", "concurrent"):
        if name in result:
            r = result[name]
            label = clients_label(1 if name == "one_at_a_time" else r["clients"])
            print(f"{label:16}{r['tokens_per_s']:>10.1f}{r['ttft_p50_s']:>10.3f}"
                  f"{r['ttft_p99_s']:>10.3f}{r['itl_p50_s']:>10.4f}{r['itl_p99_s']:>10.4f}"
                  f"{r['requests']:>10}{r['tokens']:>8}")
    if "speedup" in result:
        print(f"aggregate tokens/s, {clients_label(result['concurrent']['clients'])} vs one at a "
              f"time: {result['speedup']:.2f}x")


# ---- soak


def soak_setup(url: str) -> Any:
    import httpx

    from scratchgpt.serve.loadtest import SoakSetup

    card = model_card(url)
    limits = httpx.get(url + "/api/limits", timeout=10).json()
    return SoakSetup(prompt_words(url), limits["max_prompt_tokens"], limits["max_body_bytes"],
                     card["chat_template"] is not None)


SOAK_WORDS = ("the", "king", "to", "a", "and", "of", "love", "night")


def prompt_words(url: str) -> list[str]:
    """The soak's prompt words that the served model's tokenizer takes (a character-level
    vocabulary may lack some letters: each good request would be a 400 the soak counts as
    the server's failure), asked of the server itself; a ConfigError if it takes none."""
    import httpx

    from scratchgpt.errors import ConfigError

    words = [w for w in SOAK_WORDS if httpx.post(url + "/v1/completions", timeout=60, json={
        "prompt": w, "max_tokens": 1}).status_code == 200]
    if not words:
        raise ConfigError(f"the served model's tokenizer takes none of the soak's prompt "
                          f"words ({', '.join(SOAK_WORDS)})")
    return words


def run_soak(url: str, args: argparse.Namespace, rss: Any,
             out: dict[str, Any] | None = None) -> dict[str, Any]:
    """The soak's figures, each put in ``out`` as it is measured (what a Ctrl-C leaves: the
    warm-up's answers and the memory after it, then the soak's answers)."""
    from scratchgpt.serve.loadtest import soak

    setup = soak_setup(url)
    out = {} if out is None else out
    warm = asyncio.run(soak(url, min(200, args.soak_requests), args.soak_clients, setup, 1))
    out["warm_up"] = soak_answers(warm)
    wait_idle(url)
    before = rss()
    out["rss_before_mb"] = round(before / 2**20, 1) if before else None  # None: --url
    report = asyncio.run(soak(url, args.soak_requests, args.soak_clients, setup, 2,
                              time_limit_s=args.time_limit * 3))
    out.update({**soak_answers(report), "seconds": round(report.seconds, 1),
                "clients": args.soak_clients})
    health = wait_idle(url)
    time.sleep(1.0)  # the engine gives memory back once idle
    after = rss()
    ratio = after / before if before else None  # None: not measured (--url)
    ok = (report.server_errors == 0 and not report.unexpected and warm.server_errors == 0
          and (health["queue_depth"], health["batch_rows"]) == (0, 0)
          and (ratio is None or ratio <= 1.10))  # a leak grows; giving memory back is fine
    out.update({"queue_depth_after": health["queue_depth"],
                "batch_rows_after": health["batch_rows"],
                "rss_after_mb": None if ratio is None else round(after / 2**20, 1),
                "rss_ratio": None if ratio is None else round(ratio, 3), "passed": ok})
    return out


def soak_answers(report: Any) -> dict[str, Any]:
    """How the server answered a soak's requests (a ``SoakReport``), as figures."""
    return {"requests": report.requests, "server_errors": report.server_errors,
            "unexpected": report.unexpected,
            "statuses": {k: {str(s): n for s, n in c.items()} for k, c in report.by_kind.items()}}


def print_soak(result: dict[str, Any]) -> None:
    print(f"soak: {result['requests']} requests from {result['clients']} clients in "
          f"{result['seconds']} s")
    for kind, statuses in result["statuses"].items():
        print(f"  {kind:16} {statuses}")
    print(f"5xx answers: {result['server_errors']}; unexpected: {result['unexpected'] or 'none'}")
    memory = ("memory not measured (only that of a server the bench starts is read)"
              if result["rss_ratio"] is None else f"memory {result['rss_before_mb']} MB -> "
              f"{result['rss_after_mb']} MB (x{result['rss_ratio']})")
    print(f"after: queue {result['queue_depth_after']}, batch rows "
          f"{result['batch_rows_after']}; {memory}")
    print("PASSED" if result["passed"] else "FAILED")


MAX_CLIENTS = 256  # the bench's own bound on concurrent clients
MAX_REQUESTS = 100_000  # and on requests per phase: hours of work already


def check_args(args: argparse.Namespace) -> None:
    """Counts in range, and only a server on this machine."""
    from scratchgpt.errors import ConfigError
    from scratchgpt.serve.protocol import Limits
    from scratchgpt.serve.server import is_loopback
    from scratchgpt.validation import check_range

    limits = Limits()  # the server this bench starts (and --engine-only) takes these
    highs = {"clients": MAX_CLIENTS, "soak_clients": MAX_CLIENTS, "requests": MAX_REQUESTS,
             "soak_requests": MAX_REQUESTS,
             # a running server's own limits are read once it answers (workload)
             "prompt_tokens": math.inf if args.url else limits.max_prompt_tokens,
             "max_tokens": math.inf if args.url else limits.max_tokens}
    for flag, high in highs.items():
        check_range(flag_of(flag), getattr(args, flag), 1, high)
    if not args.time_limit > 0:  # (NaN too: it sent no request, and printed nan figures)
        raise ConfigError(f"--time-limit must be > 0 seconds, got {args.time_limit}")
    if args.engine_only and (args.url or args.soak):
        raise ConfigError("--engine-only runs no server: it cannot go with --url or --soak")
    if args.url:
        host = re.sub(r"^https?://", "", args.url).rsplit(":", 1)[0]
        if not args.url.startswith("http://") or not is_loopback(host):
            raise ConfigError(f"--url must be http://127.0.0.1:PORT (a server on this "
                              f"machine), got {args.url}")


def run(args: argparse.Namespace) -> int:
    check_args(args)
    out = JsonOutput(args)
    with out.printing(), tempfile.TemporaryDirectory() as tmp:
        if args.url:
            url = server_root(args.url)
            check_reachable(url)
            return report(args, out, url, lambda: 0)
        checkpoint = args.checkpoint
        if checkpoint is None:
            checkpoint = str(Path(tmp) / "run")
            write_random_run(args.shape, Path(checkpoint))
        if args.engine_only:
            return report_engine(args, out, checkpoint)
        with ServerProcess(checkpoint, args) as server:
            return report(args, out, server.url, server.rss_bytes)


def server_root(url: str) -> str:
    """The server's address from --url: the API's address, which the server also prints
    (``http://127.0.0.1:PORT/v1``, an OpenAI client's ``base_url``), is taken for it."""
    url = url.rstrip("/")
    return url.removesuffix("/v1")


def check_reachable(url: str) -> None:
    """A scratchgpt server answers at ``url`` (--url) with its model and its limits (its own
    route, which other OpenAI-compatible servers lack), or a ConfigError saying what answered
    instead."""
    import httpx

    from scratchgpt.errors import ConfigError

    for path, key, what in (("/v1/models", "data", "a model"),
                            ("/api/limits", "max_prompt_tokens",
                             "the limits a scratchgpt server states there")):
        try:
            r = httpx.get(url + path, timeout=10)
        except httpx.HTTPError as e:
            raise ConfigError(f"--url {url}: no server answers there ({e})") from None
        try:
            found = r.json()[key]
        except (ValueError, KeyError, TypeError):
            found = None
        if r.status_code == 401:  # the right address: the bench sends no key
            raise ConfigError(f"--url {url}: GET {path} answered 401: the server wants an "
                              "API key (--api-key), which bench serve does not send; bench "
                              "a server started without one")
        if not found:
            raise ConfigError(f"--url {url}: GET {path} answered {r.status_code} without "
                              f"{what}; give the address 'scratchgpt serve' prints, "
                              "http://127.0.0.1:PORT")


def report_engine(args: argparse.Namespace, out: JsonOutput, checkpoint: str) -> int:
    what = args.checkpoint or f"{args.shape} shape, random weights"
    result: dict[str, Any] = {"model": what, "dtype": args.dtype}
    # on Ctrl-C: the one-row figure, once measured, is kept
    with out.kept_on_interrupt(lambda: result if "tokens" in result else None,
                               lambda measured: print_engine(args, measured)):
        engine_throughput(checkpoint, args, result)
    print_engine(args, result)
    out.emit(result)
    return 0


def print_engine(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """--engine-only's report: the one-row figure, and the concurrent one where measured."""
    print(f"model: {result['model']}, {args.dtype}; {args.requests} requests of "
          f"{args.prompt_tokens} prompt + {args.max_tokens} new tokens, greedy, the engine alone "
          "(no HTTP)")
    line = f"1 row at a time: {result['engine_one_at_a_time_tokens_per_s']:.1f} tok/s"
    if "engine_concurrent_tokens_per_s" in result:
        line += (f"; up to {args.clients} rows: {result['engine_concurrent_tokens_per_s']:.1f} "
                 f"tok/s; {result['engine_speedup']:.2f}x")
    print(line)


def measured(result: dict[str, Any]) -> bool:
    """Whether bench serve's figures hold a phase measured (or the soak's warm-up)."""
    return "one_at_a_time" in result or "warm_up" in result.get("soak", {})


def served_model(url: str) -> tuple[str, str]:
    """(what, dtype) of the model a running server serves, for the report."""
    card = model_card(url)
    return f"{card['id']} (served at {url})", str(card.get("dtype", "?"))


def report(args: argparse.Namespace, out: JsonOutput, url: str, rss: Any) -> int:
    what, dtype = (served_model(url) if args.url else
                   (args.checkpoint or f"{args.shape} shape, random weights", args.dtype))
    result: dict[str, Any] = {"model": what, "dtype": dtype}
    def show(measured: dict[str, Any]) -> None:
        print(f"model: {what}, {dtype}; {args.requests} requests of {args.prompt_tokens} "
              f"prompt + {args.max_tokens} new tokens, greedy, streamed")
        print_throughput(measured)

    # on Ctrl-C: the phases measured are kept (the soak's from its warm-up on), and the
    # throughput's printed
    with out.kept_on_interrupt(lambda: result if measured(result) else None,
                               None if args.soak else show):
        if args.soak:
            run_soak(url, args, rss, result.setdefault("soak", {}))
        else:
            throughput(url, args, result)
    if args.soak:
        print(f"model: {what}, {dtype}")
        print_soak(result["soak"])
    else:
        show(result)
    out.emit(result)
    return 0 if not args.soak or result["soak"]["passed"] else 1
