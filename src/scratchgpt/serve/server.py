"""Loading a model into a service and running it under uvicorn.

    cfg = ServeConfig(checkpoint="runs/mytext")
    run_server(cfg)                              # blocks; Ctrl-C stops it
    with BackgroundServer(load_service(cfg)) as server:   # tests, benchmarks
        httpx.get(server.url + "/health")

Safe by default: the server binds 127.0.0.1; binding any address a remote machine could reach
needs an API key (:func:`check_bind`).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scratchgpt.errors import ConfigError
from scratchgpt.serve.protocol import Limits


@dataclass
class ServeConfig:
    """Everything ``scratchgpt serve`` takes."""

    checkpoint: str
    which: str | None = None  # best.pt, or last.pt before the run's first evaluation
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    model_name: str | None = None
    dtype: str = "fp32"
    threads: int = 0
    max_batch: int = 32  # rows decoded together
    max_queue: int = 128
    timeout_s: float = 600.0
    limits: Limits = field(default_factory=Limits)
    access_log: bool = True


def is_loopback(host: str) -> bool:
    """True when only this machine can reach ``host`` (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse to serve an address others can reach without an API key."""
    if not is_loopback(host) and not api_key:
        raise ConfigError(f"--host {host} would let other machines use this server: give "
                          "--api-key KEY (clients send 'Authorization: Bearer KEY') or bind "
                          "127.0.0.1")


def model_id(checkpoint: str) -> str:
    """The name ``/v1/models`` gives a checkpoint: its run directory's name (``runs/shakes``
    and ``runs/shakes/best.pt`` -> ``shakes``; ``.`` and ``best.pt`` served from inside it
    too, where they were ``model``), or a hub id (``hf:gpt2`` -> ``gpt2``)."""
    if checkpoint.startswith("hf:"):
        return checkpoint[3:]
    path = Path(os.path.abspath(checkpoint))  # (no symlink followed: the name typed stays)
    return (path.parent.name if path.suffix == ".pt" else path.name) or "model"


def written_at(path: Path) -> int:
    """When the weights the server loaded were written, in Unix seconds (``/v1/models``'
    ``created``, which said 0, 1970, for every model); 0 where that cannot be read."""
    try:
        return int(os.stat(path).st_mtime)
    except OSError:
        return 0


def load_service(cfg: ServeConfig) -> Any:
    """Load the checkpoint, ready it for decoding and build the service (engine not yet
    running: the application starts it)."""
    import torch

    from scratchgpt.chat import template_for
    from scratchgpt.checkpoints.io import load_for_generation
    from scratchgpt.generation.decode import context_length
    from scratchgpt.models.fast_decode import prepare_for_decode
    from scratchgpt.models.gpt import GPTConfig
    from scratchgpt.serve.engine import Engine
    from scratchgpt.serve.metrics import Metrics
    from scratchgpt.serve.service import ModelInfo, Service

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model, source = load_for_generation(cfg.checkpoint, cfg.which, "serve")
    check_batch_memory(model.config, cfg.max_batch, cfg.dtype)
    # batch sizes vary: no oneDNN packing (it keeps state per batch size); steps run in C
    # where they can (models/native.py), a small model's whole batch: the C step leaves the
    # GIL to the thread that streams the tokens
    model = prepare_for_decode(model, cfg.dtype, pack=False, native_rows=cfg.max_batch)
    tokenizer = source.tokenizer()
    template = template_for(source)
    context = context_length(model)
    gpt = model.config if isinstance(model.config, GPTConfig) else None
    info = ModelInfo(cfg.model_name or model_id(cfg.checkpoint), source.model_type,
                     model.config.vocab_size, context, cfg.dtype,
                     gpt and gpt.n_layer, gpt and gpt.n_head,
                     template and template.name, written_at(source.path))
    limits = cfg.limits
    if context is not None and limits.max_prompt_tokens > context:
        limits = Limits(**{**limits.__dict__, "max_prompt_tokens": context})
    # a request's rows must fit the batch at once, and its prompts (a queue place each) the
    # queue: a request larger was refused as busy (429, retry later) however idle the server
    limits = Limits(**{**limits.__dict__, "max_n": min(limits.max_n, cfg.max_batch),
                       "max_prompts": min(limits.max_prompts, cfg.max_queue)})
    metrics = Metrics()
    engine = Engine(model, max_rows=cfg.max_batch, max_queue=cfg.max_queue, observer=metrics)
    metrics.gauges = lambda: {"queue_depth": engine.queue_depth,
                              "batch_rows": engine.batch_rows}
    return Service(engine, tokenizer, info, template, limits, metrics, cfg.timeout_s,
                   attention_tokens=min(context or 256, 256))


def check_batch_memory(config: Any, max_batch: int, dtype: str = "fp32",
                       available: int | None = None) -> None:
    """Refuse (one line) a ``max_batch`` whose KV caches, each row's keys and values over the
    model's whole context, could not fit in the memory available (``scratchgpt.memory``; the
    weights, loaded already, are not in it): the batch grows to it under load, and only then
    would the server fail or swap. bf16 weights keep a bf16 cache."""
    from scratchgpt import memory
    from scratchgpt.models.gpt import GPTConfig

    per_row = memory.inference_estimate(config, 1).parts["kv_cache"]
    per_row //= 2 if dtype == "bf16" else 1
    free = memory.available_bytes() if available is None else available
    length = config.block_size if isinstance(config, GPTConfig) else None  # (else a state)
    rows = f"{max_batch:,} sequences" + (f" of {length} tokens" if length else "")
    memory.check_fits(memory.Estimate({"kv_cache": max_batch * per_row}),
                      f"--max-batch {max_batch}, a batch of {rows},", available=free,
                      remedy=f"lower --max-batch (at most {free // max(per_row, 1):,} fit)")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (``port`` 0: any free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


GRACE_S = 5.0  # how long a stopping server lets running requests finish


def _uvicorn_server(service: Any, api_key: str | None, access_log: bool,
                    log_level: str = "info", grace_s: float = GRACE_S) -> Any:
    import asyncio
    import contextlib

    import uvicorn

    from scratchgpt.serve.app import create_app

    class Server(uvicorn.Server):  # type: ignore[misc]
        """uvicorn's server, stopping (Ctrl-C, SIGTERM) as a client would want: requests still
        generating get ``grace_s`` seconds to finish; then the engine stops, and each ends as
        a request to a stopping server does (a 503; a stream, its error event and
        ``[DONE]``). uvicorn alone would cancel them mid-stream after its own timeout, the
        client's stream cut short and a traceback in the log.

        A second signal while stopping (a second Ctrl-C) cuts the grace short: generation
        ends at once, the same way. uvicorn's own force quit would cancel every request's
        task instead: streams cut mid-chunk and a traceback for each in the log."""

        hurry: asyncio.Event | None = None  # set by a second signal
        loop: asyncio.AbstractEventLoop | None = None

        async def startup(self, sockets: Any = None) -> None:
            self.hurry, self.loop = asyncio.Event(), asyncio.get_running_loop()
            await super().startup(sockets)

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit and self.hurry is not None and not self.hurry.is_set():
                # a signal handler interrupts the loop between two steps: the loop sets it
                self.loop.call_soon_threadsafe(self.hurry.set)
                return
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets: Any = None) -> None:
            async def end_generation() -> None:
                if self.hurry is not None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.hurry.wait(), grace_s)
                await asyncio.to_thread(service.engine.stop)

            ending = asyncio.ensure_future(end_generation())
            try:
                await super().shutdown(sockets)
            finally:
                ending.cancel()

    config = uvicorn.Config(create_app(service, api_key), log_level=log_level,
                            access_log=access_log, timeout_graceful_shutdown=grace_s + 5,
                            limit_concurrency=None, backlog=2048)
    return Server(config)


def run_server(cfg: ServeConfig, announce: Any = print) -> None:
    """Serve until interrupted (Ctrl-C, SIGTERM)."""
    check_bind(cfg.host, cfg.api_key)
    sock = bind(cfg.host, cfg.port)
    try:
        service = load_service(cfg)
    except BaseException:  # a checkpoint or a setting refused: the port is free again at once
        sock.close()
        raise
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    announce(f"serving {service.info.id} ({service.info.model_type}, {cfg.dtype}) on "
             f"http://{shown}:{port}  (playground: http://{shown}:{port}/ , API: "
             f"http://{shown}:{port}/v1)")
    announce(limits_line(service.limits, cfg.limits, cfg.max_batch))
    _uvicorn_server(service, cfg.api_key, cfg.access_log).run(sockets=[sock])


def limits_line(limits: Limits, asked: Limits, max_batch: int) -> str:
    """What one request may ask of the server, as it starts: a prompt limit the model's
    context lowered (``--max-prompt-tokens`` or its default) says so.

    >>> limits_line(Limits(max_prompt_tokens=256), Limits(), 32)[:58]
    "limits: prompts of up to 256 tokens (the model's context),"
    """
    lowered = " (the model's context)" if limits.max_prompt_tokens < asked.max_prompt_tokens \
        else ""
    return (f"limits: prompts of up to {limits.max_prompt_tokens} tokens{lowered}, "
            f"{limits.max_tokens} new tokens a request, {max_batch} sequences decoded together")


class BackgroundServer:
    """A server on 127.0.0.1 (a free port) in a background thread, for tests and benchmarks:
    ``with BackgroundServer(service) as s: ... s.url``."""

    def __init__(self, service: Any, api_key: str | None = None, host: str = "127.0.0.1",
                 grace_s: float = GRACE_S):
        self.service = service
        self.sock = bind(host, 0)
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"
        self.server = _uvicorn_server(service, api_key, access_log=False, log_level="warning",
                                      grace_s=grace_s)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="scratchgpt-server", daemon=True)

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            self.thread.join(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()
