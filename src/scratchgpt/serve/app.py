"""The HTTP side: a Starlette application over a :class:`~scratchgpt.serve.service.Service`.

    GET  /                      the playground (static files shipped in the package)
    GET  /health                {"status": "ok", ...}
    GET  /metrics               Prometheus text
    GET  /v1/models             the one model served
    POST /v1/completions        OpenAI completions (stream: server-sent events)
    POST /v1/chat/completions   OpenAI chat completions (models with a chat template)
    POST /api/attention         the playground's attention maps (GPT models)
    GET  /api/limits            what a request may ask for

With an API key every route but ``/``, ``/static/...`` and ``/health`` needs ``Authorization:
Bearer KEY``. Request bodies over ``limits.max_body_bytes`` are refused (413) as they arrive.
No route reads or writes a file a client names: the playground's files are read from the
package once, into memory, and served by name from that fixed set.

The application starts the engine's thread when the server starts (its events come back
through the event loop's ``call_soon_threadsafe``) and stops it at shutdown. A client that
disconnects, streaming or not, has its job cancelled at once, which frees its batch rows at the
engine's next step; one that hangs up while still sending its body is counted as a client gone
(499), not logged and counted as the server's error.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import importlib.resources
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from scratchgpt.errors import ScratchGPTError
from scratchgpt.serve import protocol as api
from scratchgpt.serve import service as svc
from scratchgpt.serve.attention import attention_map, out_of_range
from scratchgpt.wording import a_kind

STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".css": "text/css; charset=utf-8", ".png": "image/png", ".svg": "image/svg+xml"}
CLIENT_CLOSED = 499  # the status the metrics record for a request whose client went away
UNMATCHED = "other"  # the metrics' endpoint for a request that matched no route
ENDPOINT_KEY = "scratchgpt.endpoint"  # the scope's note of the route template a request matched


def static_files() -> dict[str, tuple[bytes, str]]:
    """The playground's files (name -> (content, media type)), read from the package."""
    root = importlib.resources.files("scratchgpt.serve") / "static"
    out = {}
    for entry in root.iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in STATIC_TYPES:
            out[entry.name] = (entry.read_bytes(), STATIC_TYPES[suffix])
    return out


def error_response(e: api.ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


class EventStream(StreamingResponse):
    """Server-sent events that stop as soon as the client goes away: ``on_close`` runs then
    (or when the stream ends), whichever ASGI version the server speaks. ``on_end`` (the
    request's count) runs once the stream is over with its status: 200 when it was all sent,
    499 when the client hung up before its end; a bug that ended it calls nothing: the
    server's 500 handler counts that request, as a 500."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None]):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close = on_close
        self.on_end: Callable[[int], None] = lambda status: None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        crashed, sent = False, False
        try:
            async with anyio.create_task_group() as tg:
                async def stream() -> None:
                    nonlocal sent
                    with contextlib.suppress(OSError):
                        await self.stream_response(send)
                        sent = True  # (a client gone mid-send raised, or cancelled this)
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        except Exception:
            crashed = True
            raise
        finally:
            self.on_close()
            await self.body_iterator.aclose()
            if not crashed:
                self.on_end(self.status_code if sent else CLIENT_CLOSED)


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, work: Awaitable[Any]) -> tuple[bool, Any]:
    """Await ``work`` unless the client disconnects first (then ``work`` is cancelled):
    returns (finished, its result)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this handler itself is cancelled (shutdown)
        task.cancel()
        raise
    finally:
        watch.cancel()
    if task.done():
        return True, task.result()  # raises what the work raised
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, api.ApiError):
        await task
    return False, None


async def _guarded(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The events; a failure after the stream began ends it with an error event. A bug ends
    it so too (the client reads why its text stopped, not a body cut short), and is raised on
    for the server to log and count as a 500."""
    try:
        async for chunk in events:
            yield chunk
    except api.ApiError as e:
        yield api.sse(e.body())
        yield api.sse("[DONE]")
    except Exception:
        yield api.sse(api.ApiError(500, "internal server error").body())
        yield api.sse("[DONE]")
        raise


class Handlers:
    """The routes' functions over one service."""

    def __init__(self, service: svc.Service, api_key: str | None):
        self.service, self.api_key = service, api_key
        self.files = static_files()

    # ---- plumbing

    def authorized(self, request: Request) -> bool:
        if self.api_key is None:
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(),
                                                                  self.api_key.encode())

    async def read_json(self, request: Request) -> dict[str, Any]:
        limit = self.service.limits.max_body_bytes
        too_big = api.ApiError(413, f"the request body exceeds {limit} bytes")
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise too_big
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise too_big
        return api.parse_json(bytes(body))

    def endpoint(self, template: str, fn: Callable[[Request], Awaitable[Response]],
                 public: bool = False) -> Callable[[Request], Awaitable[Response]]:
        """``fn`` with the API key check, ApiError answers and the request count, which is
        kept under the route's ``template`` (never the path a client sent: each new one
        would be one more series, for ever). A stream is counted when it ends, so that one
        that fails midway is counted once, by the 500 handler."""
        async def handle(request: Request) -> Response:
            request.scope[ENDPOINT_KEY] = template
            try:
                if not public and not self.authorized(request):
                    raise api.ApiError(401, "a valid API key is required (Authorization: "
                                            "Bearer KEY)", code="invalid_api_key",
                                       headers={"WWW-Authenticate": "Bearer"})
                response = await fn(request)
            except api.ApiError as e:
                response = error_response(e)
            except ClientDisconnect:  # gone before its body was all sent: no one to answer
                response = Response(status_code=CLIENT_CLOSED)
            count = partial(self.service.metrics.request_done, template)
            if isinstance(response, EventStream):
                response.on_end = count  # with its status once it ends (or the client went)
            else:
                count(response.status_code)
            return response
        return handle

    # ---- routes

    async def page(self, request: Request) -> Response:
        content, media = self.files["index.html"]
        return Response(content, media_type=media)

    async def static(self, request: Request) -> Response:
        found = self.files.get(request.path_params["name"])
        if found is None or found is self.files["index.html"]:
            raise api.ApiError(404, "no such file")
        return Response(found[0], media_type=found[1],
                        headers={"Cache-Control": "no-cache"})

    async def health(self, request: Request) -> Response:
        engine = self.service.engine
        ok = engine.running
        return JSONResponse({"status": "ok" if ok else "stopped", "model": self.service.info.id,
                             "queue_depth": engine.queue_depth, "batch_rows": engine.batch_rows},
                            status_code=200 if ok else 503)

    async def metrics(self, request: Request) -> Response:
        return PlainTextResponse(self.service.metrics.render(),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    async def limits(self, request: Request) -> Response:
        """What a request may ask for (this server's own route; the soak reads it)."""
        engine = self.service.engine
        return JSONResponse({**dataclasses.asdict(self.service.limits),
                             "max_batch": engine.max_rows, "max_queue": engine.max_queue,
                             "timeout_s": self.service.timeout_s})

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self.service.info.card()]})

    async def model(self, request: Request) -> Response:
        self.service.check_model(request.path_params["model"])
        return JSONResponse(self.service.info.card())

    async def completions(self, request: Request) -> Response:
        req = api.parse_completion(await self.read_json(request), self.service.limits)
        if not req.gen.stream:
            return await self._whole(request, svc.complete(self.service, req))
        run, texts = svc.completion_run(self.service, req)
        events = svc.stream_completion(self.service, run, texts, req.echo, req.gen.include_usage)
        return await self._stream(request, run, events)

    async def chat(self, request: Request) -> Response:
        req = api.parse_chat(await self.read_json(request), self.service.limits)
        if not req.gen.stream:
            return await self._whole(request, svc.chat(self.service, req))
        run = svc.chat_run(self.service, req)
        return await self._stream(request, run, svc.stream_chat(
            self.service, run, req.gen.include_usage, req.service_tier))

    async def _whole(self, request: Request, work: Awaitable[dict]) -> Response:
        finished, body = await _unless_disconnected(request, work)
        if not finished:
            return Response(status_code=CLIENT_CLOSED)
        return JSONResponse(body)

    async def _stream(self, request: Request, run: svc.Run,
                      events: AsyncIterator[bytes]) -> Response:
        """Start the run; answer with its status if it fails before its first token, else
        with the event stream."""
        run.start()
        try:
            started, _ = await _unless_disconnected(request, run.started())
        except api.ApiError:
            run.cancel()
            raise
        if not started:
            run.cancel()
            return Response(status_code=CLIENT_CLOSED)
        return EventStream(_guarded(events), on_close=run.cancel)

    async def attention(self, request: Request) -> Response:
        """``{"text": str}`` or ``{"tokens": [ids]}``, and ``layer`` / ``head`` (null: the
        mean) -> the token labels and their (T, T) weights."""
        from scratchgpt.viz import token_labels

        body = await self.read_json(request)
        info, service = self.service.info, self.service
        if info.n_layer is None:
            raise api.ApiError(400, f"{a_kind(info.model_type)} model has no attention to show")
        f = api.check_fields(body, api.ATTENTION_FIELDS)
        wrong = out_of_range(f["layer"], f["head"], info.n_layer, info.n_head or 0)
        if wrong is not None:
            raise api.ApiError(400, wrong[1], param=wrong[0])
        if f["text"] is not None and f["tokens"] is not None:
            raise api.ApiError(400, "give 'text' or 'tokens', not both", param="tokens")
        ids, _ = service.tokens(f["tokens"] or f["text"] or "",
                                param="tokens" if f["tokens"] else "text")
        if not ids:
            raise api.ApiError(400, "give a non-empty 'text' or 'tokens'")
        shown = ids[: service.attention_tokens]
        try:
            weights = await asyncio.wrap_future(service.engine.call(
                lambda: attention_map(service.engine.batch.model, shown, f["layer"], f["head"])))
        except ScratchGPTError as e:
            raise api.ApiError(400, str(e)) from None
        return JSONResponse({"tokens": token_labels(service.tokenizer, shown), "ids": shown,
                             "layer": f["layer"], "head": f["head"],
                             "truncated": len(shown) < len(ids),
                             "weights": [[round(x, 4) for x in row] for row in weights.tolist()]})


def create_app(service: svc.Service, api_key: str | None = None) -> Starlette:
    """The application; its lifespan starts and stops the service's engine."""
    h = Handlers(service, api_key)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        service.engine.post = asyncio.get_running_loop().call_soon_threadsafe
        service.engine.start()
        try:
            yield
        finally:
            await asyncio.to_thread(service.engine.stop)

    async def not_found(request: Request, exc: HTTPException) -> Response:
        # a 405 keeps the Allow header that names the methods the route takes
        response = error_response(api.ApiError(exc.status_code, f"{request.method} "
                                               f"{request.url.path}: {exc.detail}",
                                               headers=exc.headers))
        service.metrics.request_done(UNMATCHED, exc.status_code)
        return response

    async def crashed(request: Request, exc: Exception) -> Response:
        service.metrics.request_done(request.scope.get(ENDPOINT_KEY, UNMATCHED), 500)
        return error_response(api.ApiError(500, "internal server error"))

    def route(template: str, fn: Callable[[Request], Awaitable[Response]], method: str,
              public: bool = False) -> Route:
        return Route(template, h.endpoint(template, fn, public), methods=[method])

    routes = [
        route("/", h.page, "GET", public=True),
        route("/static/{name}", h.static, "GET", public=True),
        route("/health", h.health, "GET", public=True),
        route("/metrics", h.metrics, "GET"),
        route("/v1/models", h.models, "GET"),
        route("/v1/models/{model:path}", h.model, "GET"),
        route("/v1/completions", h.completions, "POST"),
        route("/v1/chat/completions", h.chat, "POST"),
        route("/api/attention", h.attention, "POST"),
        route("/api/limits", h.limits, "GET"),
    ]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={404: not_found, 405: not_found, 500: crashed})
