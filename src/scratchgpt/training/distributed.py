"""Data-parallel training through ``torch.distributed``: one process per GPU (NCCL), or several
processes sharing a CPU's cores (gloo).

Every process holds a full copy of the model and trains on its own share of each batch;
``DistributedDataParallel`` averages the gradients, so every copy takes the same optimizer step.
Two ways in:

* ``scratchgpt train --nproc N``: :func:`launch` starts N processes on this machine;
* ``torchrun --nproc-per-node N -m scratchgpt train ...`` (or several nodes): the processes are
  started by torchrun, and :func:`init_from_env` joins them from its environment variables.

On one small CPU this buys nothing: on the project's 2-core machine two single-threaded
processes train no faster than one two-threaded process (docs/BENCHMARKS.md). The gain is on
several GPUs, or CPUs with many cores.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import torch
import torch.distributed as dist

from scratchgpt.errors import ScratchGPTError, Terminated

T = TypeVar("T")
# The signals that stop a run (held back in a --nproc process until it can hear them)
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: ``rank`` of ``world_size``; rank 0 writes the run's files."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def current() -> DistInfo:
    """This process's place in the process group (rank 0 of 1 when there is none)."""
    if not (dist.is_available() and dist.is_initialized()):
        return DistInfo()
    return DistInfo(dist.get_rank(), dist.get_world_size(),
                    int(os.environ.get("LOCAL_RANK", dist.get_rank())))


def backend_for(device: str) -> str:
    return "nccl" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) \
        else "gloo"


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def init_from_env(device: str) -> DistInfo:
    """Join the process group described by torchrun's environment variables."""
    if not dist.is_initialized():
        dist.init_process_group(backend_for(device))
    info = current()
    if backend_for(device) == "nccl":
        torch.cuda.set_device(info.local_rank)
    return info


@contextlib.contextmanager
def process_group() -> Iterator[None]:
    """Leave the process group at the end of the block: together after success (a peer must
    not tear down a group that another still uses), at once after an error."""
    try:
        yield
    except BaseException:
        dist.destroy_process_group()
        raise
    dist.barrier()
    dist.destroy_process_group()


def main_first(step: Callable[[], T]) -> T | None:
    """``step()`` in rank 0 alone, the other processes waiting until it is done; its value
    there, None in the others. Rank 0's error is raised in rank 0 (the command's one line)
    and ends the others at once, with the same exit code and nothing to say: they waited at a
    barrier, which rank 0 left by exiting, and each died of the broken connection, a
    traceback of gloo's apiece after the one line."""
    failed: list[int | None] = [None]
    value = None
    if current().is_main:
        try:
            value = step()
        except BaseException as e:
            failed[0] = 2 if isinstance(e, ScratchGPTError) else \
                130 if isinstance(e, KeyboardInterrupt) else 1
            # (a Ctrl-C reaches the others too: those that left already cannot be told)
            with contextlib.suppress(RuntimeError):
                dist.broadcast_object_list(failed, src=0)
            raise
    dist.broadcast_object_list(failed, src=0)
    if failed[0] is not None:
        exit_process(failed[0])
    return value


@contextlib.contextmanager
def quiet_unless_main() -> Iterator[None]:
    """In a process torchrun started: a block that a Ctrl-C (or SIGTERM) ends is said to be
    interrupted by rank 0 alone, the others ending at once (exit code 130, or 143) without a
    word. The signal reaches every process of the job (a terminal signals the whole group,
    and torchrun relays it), and before the training loop, which stops every rank after the
    same step, each said 'interrupted', one line per process; or, a peer having left first,
    failed in a collective with a gloo traceback. So an error raised after a stop signal
    came (which the block may have held back: signals_held) is that interruption."""
    import threading

    if not launched_by_torchrun() or threading.current_thread() is not threading.main_thread():
        yield  # (only the main thread hears signals)
        return
    with _SignalsSeen() as signals:
        try:
            yield
        except BaseException as e:
            stop = _interruption(e) or signals.stop()
            if stop is None:
                raise
            if int(os.environ["RANK"]) != 0:
                exit_process(143 if isinstance(stop, Terminated) else 130)
            if stop is e:
                raise
            raise stop from e


def _interruption(e: BaseException | None) -> KeyboardInterrupt | None:
    """The interruption ``e`` is, or was raised while handling (None if neither)."""
    while e is not None and not isinstance(e, KeyboardInterrupt):
        e = e.__context__
    return e


class _SignalsSeen:
    """The stop signals this process gets inside the block, whichever handler takes them (a
    handler that records a signal, as signals_held's does, raises nothing if the block fails
    meanwhile): Python's own signal handler writes each signal's number to the wakeup fd,
    here a pipe's end."""

    def __enter__(self) -> _SignalsSeen:
        self._read, self._write = os.pipe()
        for fd in (self._read, self._write):
            os.set_blocking(fd, False)
        self._previous = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        return self

    def __exit__(self, *exc: Any) -> None:
        signal.set_wakeup_fd(self._previous)
        os.close(self._read)
        os.close(self._write)

    def stop(self) -> KeyboardInterrupt | None:
        """The first stop signal seen so far, as the exception it raises (None if none)."""
        try:
            seen = [s for s in os.read(self._read, 4096) if s in _STOP_SIGNALS]
        except BlockingIOError:  # (nothing written)
            return None
        if not seen:
            return None
        return Terminated() if seen[0] == signal.SIGTERM else KeyboardInterrupt()


def exit_process(code: int) -> NoReturn:
    """End a training process at once, skipping the interpreter's teardown.

    Why: ``DistributedDataParallel`` keeps the gloo process group alive past
    ``destroy_process_group`` (torch 2.13), so its worker threads outlive the training. A worker
    may still be dropping the last reference to a tensor made in Python (the all-gather of RNG
    states just before an interrupted run's save, say); that needs the GIL, and during teardown
    a thread that asks for the GIL is stopped, which aborts the process ("terminate called
    without an active exception"). Everything worth keeping is written and closed by now, so
    flushing the terminal and leaving is both safe and race-free.
    """
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# What every training process imports: torch, torch._dynamo (DDP imports it when it wraps the
# model, 1-2 s) and the training job.
_PRELOAD = ("torch", "torch._dynamo", "scratchgpt.training.job")
# How long the other processes have to end on their own once one has ended with an error (a
# Ctrl-C ends them all at once): torch's join otherwise kills them, with a warning apiece
_GRACE_S = 10.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated


def _raise_if_stopped(stopped: Any) -> None:
    """Raise the stop signal the parent recorded (``stopped.value``: its number, 0 if none),
    as the signal itself would have been raised here."""
    if stopped.value:
        raise Terminated if stopped.value == signal.SIGTERM else KeyboardInterrupt


def _worker(rank: int, world: int, port: int, device: str, fn: Callable[..., Any],
            args: tuple, results: Any, stopped: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    # Ctrl-C reaches every process of the terminal's group: the parent only records it, and
    # relays SIGTERM; each child turns either into a stop request that the training loop
    # honours at the next step, in step with the others (before the loop, into an exception,
    # as in one process). Until here both were blocked (:func:`_start_fork_server`): one
    # that came meanwhile is raised as the mask lifts, and one that came before this process
    # was forked is the parent's record (checked again once the group has formed, by when
    # the parent has surely recorded a signal that came as this process was forked).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
        _raise_if_stopped(stopped)
        _thread_lock_for_bars()
        init_from_env(device)
        _raise_if_stopped(stopped)
        with process_group():
            out = fn(*args)
        if rank == 0:
            results.put(("done", out))  # SimpleQueue: written to the pipe before put returns
    except BaseException as e:  # noqa: BLE001 - every failure goes to the parent, which raises
        results.put(("error", _portable(e, rank)))
        exit_process(1)
    exit_process(0)


def _thread_lock_for_bars() -> None:
    """tqdm's first bar makes a multiprocessing lock, a named semaphore that the resource
    tracker follows; a training process ends by :func:`exit_process`, which never releases it,
    so every ``--nproc`` run with a progress bar ended with the tracker's warning of a leaked
    semaphore. One process draws the bar: a thread lock is all it needs."""
    import threading

    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())


def _portable(e: BaseException, rank: int) -> BaseException:
    """An exception the parent can raise as this process's: scratchgpt's one-line errors and
    interruptions as they are, anything else with its traceback as text."""
    if isinstance(e, ScratchGPTError | KeyboardInterrupt):
        return e
    import traceback

    # (kept short: the pipe to the parent is read only once every process has ended)
    return RuntimeError(f"training process {rank} failed:\n{traceback.format_exc()[-8000:]}")


def launch(nproc: int, device: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(*args)`` in ``nproc`` new processes joined in one process group on this
    machine; return rank 0's result. ``fn`` and ``args`` must be picklable. An error in any
    process is raised here (a scratchgpt error stays one line); SIGTERM sent to this process
    alone (``kill PID``) is relayed to the processes, which stop after the step and save.
    A Ctrl-C (or SIGTERM) while the processes start ends them before their first step: the
    interruption is raised here, as in one process (it was lost, the run training on)."""
    import torch.multiprocessing as mp

    # A fork server, not a fresh interpreter per process: the server (a clean process that
    # has started no threads) imports torch and the trainer once, and each process is a fork
    # of it, so N processes do not each pay seconds of imports, and later launches from the
    # same program (a sweep, the tests) pay none.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(_PRELOAD))
    results = ctx.SimpleQueue()
    stopped = ctx.RawValue("i", 0)  # the first stop signal this process got (shared memory)
    context = None

    def record(signum: int, frame: Any) -> None:
        stopped.value = stopped.value or signum

    def relay(signum: int, frame: Any) -> None:
        record(signum, frame)
        for p in context.processes if context is not None else ():
            if p.is_alive():
                os.kill(p.pid, signum)

    previous = {signal.SIGINT: signal.signal(signal.SIGINT, record),
                signal.SIGTERM: signal.signal(signal.SIGTERM, relay)}
    try:
        _start_fork_server()
        with _main_module_not_run_again():
            context = mp.start_processes(_worker, args=(nproc, _free_port(), device, fn,
                                                        args, results, stopped),
                                         nprocs=nproc, join=False, start_method="forkserver")
        with contextlib.suppress(mp.ProcessExitedException, mp.ProcessRaisedException):
            while not context.join(grace_period=_GRACE_S):
                pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return _outcome(results)


def _start_fork_server() -> None:
    """Start the fork server, if it is not running yet, with Ctrl-C and SIGTERM blocked: the
    mask passes to it and to every process forked from it, which lifts it once it has its
    handlers (:func:`_worker`). The server had inherited this process's ignoring of Ctrl-C
    while it started, and so did each training process until it set its handlers: a Ctrl-C
    in the seconds they took to start was lost, and the run trained on."""
    from multiprocessing import forkserver

    held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


@contextlib.contextmanager
def _main_module_not_run_again() -> Iterator[None]:
    """Start processes that do not run the caller's script again. multiprocessing runs the
    ``__main__`` module's file (or module) in each new process before its function, so a
    script that calls ``scratchgpt.train`` with ``nproc=2`` and has no ``if __name__ ==
    "__main__":`` guard ran again in each training process: each tried to start a training of
    its own (the run is in use, a traceback apiece), and the call itself failed after a wait
    with 'a training process ended without a result'. The processes need nothing of it (their
    function and job are the library's), so they are not told where it is."""
    import sys

    main = sys.modules.get("__main__")
    hidden = {k: main.__dict__[k] for k in ("__file__", "__spec__")
              if main is not None and k in main.__dict__}
    for k in hidden:
        setattr(main, k, None)
    try:
        yield
    finally:
        for k, v in hidden.items():
            setattr(main, k, v)


def _outcome(results: Any) -> Any:
    """Rank 0's result, or the most telling error the processes sent."""
    messages = []
    while not results.empty():
        messages.append(results.get())
    errors = [e for kind, e in messages if kind == "error"]
    for kind in (ScratchGPTError, KeyboardInterrupt, BaseException):
        for e in errors:
            if isinstance(e, kind):
                raise e
    done = [out for kind, out in messages if kind == "done"]
    if not done:
        raise RuntimeError("a training process ended without a result (killed?)")
    return done[0]
