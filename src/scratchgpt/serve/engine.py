"""The engine: one thread runs the model for every request (continuous batching).

Other threads (the web server's) hand it :class:`~scratchgpt.serve.batch.Job` objects with
:meth:`Engine.submit`; each iteration of its loop

1. runs queued side calls (:meth:`Engine.call`: the playground's attention maps, so that only
   this thread ever runs the model),
2. drops the rows of jobs that were cancelled (a client went away) or ran out of time,
3. admits queued jobs while rows are free (``max_rows``), prefilling each as it comes in
   (at most ``prefill_tokens`` prompt tokens per iteration after the first job, so a burst of
   arrivals does not stall the running rows for long),
4. runs one decode step of the batch, and
5. hands each job its events through ``post`` (the web server passes its event loop's
   ``call_soon_threadsafe``; one call per iteration carries every job's events).

The queue is bounded (``max_queue``): :meth:`submit` raises :class:`QueueFull` beyond it, and a
job still queued at its deadline fails with status 503.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

import torch

from scratchgpt.errors import GenerationError
from scratchgpt.serve.batch import ContinuousBatch, Deliveries, Ended, Failed, Job, TokenOut


class QueueFull(Exception):
    """The engine's queue holds ``max_queue`` jobs already."""


class EngineStopped(Exception):
    """The engine is not running (not started, or shut down)."""


class EngineObserver(Protocol):
    """What the engine reports as it runs (the server's metrics)."""

    def tokens_generated(self, n: int) -> None: ...

    def first_token(self, seconds: float) -> None: ...


class _NoObserver:
    def tokens_generated(self, n: int) -> None:
        pass

    def first_token(self, seconds: float) -> None:
        pass


def _direct(fn: Callable[[], None]) -> None:
    fn()


def release_memory() -> None:
    """Give freed heap memory back to the system (glibc's ``malloc_trim``), so an idle
    server's memory returns to where it started; a no-op elsewhere."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class Engine:
    """Runs ``model`` (ready to decode) for submitted jobs in one background thread."""

    def __init__(self, model: Any, max_rows: int = 16, max_queue: int = 64,
                 prefill_tokens: int = 1024, post: Callable[[Callable[[], None]], None] = _direct,
                 observer: EngineObserver | None = None):
        self.batch = ContinuousBatch(model)
        self.max_rows, self.max_queue, self.prefill_tokens = max_rows, max_queue, prefill_tokens
        self.post = post
        self.observer = observer or _NoObserver()
        self._queue: deque[Job] = deque()
        self._calls: deque[tuple[Callable[[], Any], Future]] = deque()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False

    # ---- called from other threads

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="scratchgpt-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop; jobs still queued or running fail with status 503."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def submit(self, job: Job) -> None:
        """Queue ``job``; raises :class:`QueueFull` or :class:`EngineStopped`."""
        if job.n > self.max_rows:
            raise ValueError(f"a job of {job.n} rows can never fit {self.max_rows} rows")
        with self._wake:
            if not self.running:
                raise EngineStopped("the engine is not running")
            if len(self._queue) >= self.max_queue:
                raise QueueFull(f"{len(self._queue)} requests are waiting already")
            self._queue.append(job)
            self._wake.notify()

    def cancel(self, job: Job) -> None:
        """Drop ``job`` at the engine's next step (its rows are freed; no more events)."""
        job.cancelled = True
        with self._wake:
            self._wake.notify()

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn()`` on the engine thread between two steps; its result comes in the
        future."""
        fut: Future = Future()
        with self._wake:
            if not self.running:
                raise EngineStopped("the engine is not running")
            self._calls.append((fn, fut))
            self._wake.notify()
        return fut

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def batch_rows(self) -> int:
        return self.batch.size

    # ---- the engine thread

    def _run(self) -> None:
        with torch.inference_mode():
            while self._wait_for_work():
                self._iteration()
        self._fail_everything(503, "the server is shutting down")

    def _wait_for_work(self) -> bool:
        """Block while there is nothing to do; False once stopping. After half a second
        without work, freed memory goes back to the system."""
        released = False
        with self._wake:
            while not (self._stopping or self._queue or self._calls or self.batch.rows):
                if released:
                    self._wake.wait()
                elif not self._wake.wait(0.5):
                    release_memory()
                    released = True
            return not self._stopping

    def _iteration(self) -> None:
        self._run_calls()
        out = Deliveries()
        try:
            self._expire(out)
            self._admit(out)
            if self.batch.rows:
                for job, events in self.batch.step().items():
                    out.add(job, events)
        except Exception:  # a bug: fail what was running, keep serving the next requests
            traceback.print_exc(file=sys.stderr)
            for job in self.batch.jobs():
                out.add(job, [Failed(500, "internal error while generating")])
            self.batch = ContinuousBatch(self.batch.model)
        self._deliver(out)

    def _run_calls(self) -> None:
        while self._calls:
            fn, fut = self._calls.popleft()
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except Exception as e:  # the caller sees it
                    fut.set_exception(e)

    def _expire(self, out: Deliveries) -> None:
        """Cancelled jobs leave silently; jobs past their deadline end ("length") or, still
        queued, fail."""
        now = time.monotonic()
        late = {r.job for r in self.batch.rows if r.job.cancelled or r.job.deadline <= now}
        for row in self.batch.drop(late):
            if not row.job.cancelled:
                out.add(row.job, [Ended(row.choice, "length")])
        with self._wake:
            waiting = [j for j in self._queue if j.cancelled or j.deadline <= now]
            for job in waiting:
                self._queue.remove(job)
        for job in waiting:
            if not job.cancelled:
                out.add(job, [Failed(503, "the request timed out waiting for the model")])

    def _admit(self, out: Deliveries) -> None:
        """Admit queued jobs, in order, while rows are free and their prompts fit the prefill
        budget (the first always does); they are prefilled together."""
        jobs, rows, width = [], self.batch.size, 0
        with self._wake:
            while self._queue:
                job = self._queue[0]
                wider = max(width, len(job.prompt))
                if rows + job.n > self.max_rows or (
                        jobs and wider * (len(jobs) + 1) > self.prefill_tokens):
                    break
                self._queue.popleft()
                try:
                    self.batch.check(job)
                except GenerationError as e:  # this prompt cannot run
                    out.add(job, [Failed(400, str(e))])
                    continue
                jobs.append(job)
                rows, width = rows + job.n, wider
        if jobs:
            self.batch.admit(jobs, out)

    def _deliver(self, out: Deliveries) -> None:
        if not out:
            return
        now, tokens = time.monotonic(), 0
        for job, events in out.items():
            n = sum(isinstance(e, TokenOut) for e in events)
            tokens += n
            if n and job.first_token_at is None:
                job.first_token_at = now
                self.observer.first_token(now - job.created)
        self.observer.tokens_generated(tokens)
        items = list(out.items())
        try:
            self.post(lambda: _hand_out(items))
        except RuntimeError:  # the receiving event loop has closed: nobody is listening
            pass

    def _fail_everything(self, status: int, message: str) -> None:
        out = Deliveries()
        for job in [*self.batch.jobs(), *self._queue]:
            out.add(job, [Failed(status, message)])
        self._queue.clear()
        self.batch = ContinuousBatch(self.batch.model)
        for _, fut in self._calls:
            fut.cancel()
        self._deliver(out)


def _hand_out(items: list[tuple[Job, list]]) -> None:
    for job, events in items:
        if not job.cancelled:
            job.sink(events)
