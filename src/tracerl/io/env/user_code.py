"""The one runner for code a user supplies (a task's tools, its state factories, its rewards): each call has a
deadline, a cap on what it returns and prints, and a kill.

`Runner(kind, workers, timeout_s)`: `submit(fn, *args)` starts a call and returns a future; `call(fn, *args)` waits
for it. A call past its deadline raises `CallTimeout`; one that raised, died or returned what cannot come back
raises `CallFailed` (the text says which). The kinds:

- "process": `workers` long-lived worker processes, forked from this one when the first call comes. A call past
  its deadline (asleep in C, ignoring signals, catching every exception) is killed with its worker's whole process
  group (what the call started too), and the worker replaced; a worker that dies is replaced. The function goes to
  the worker pickled, or, when it is one of `inherited` (given when the runner is made, before any worker is forked),
  by its index: a closure or a function defined in a test then works, as the worker already holds it. The
  arguments and the result are pickled. Used for tools and state factories, and for `reward_pool="process"`.
- "thread": each call in a daemon thread of this process. A thread cannot be killed: past its deadline the caller
  gets `CallTimeout` and the thread is abandoned (its worker slot goes to the next call); after `MAX_STUCK_THREADS`
  abandoned threads still run, new calls fail at once rather than pile up. For code that needs this process's
  threads (verl's event loop) or I/O-bound rewards.
- "none": in the caller's thread, without a deadline (debugging).

In a worker, what a call prints is capped at `MAX_PRINTED_CHARS` (then dropped, with one line saying so), a result at
`MAX_RESULT_BYTES` pickled, and the worker asks the kernel to kill it when the thread that started it ends (Linux),
so a trainer that dies leaves no worker behind. A call made inside a worker (a `__del__` that frees a state) runs
inline, under the deadline of the call it is part of.

Measured per tool call on a 2-core machine, in a process that imported torch (`benchmarks/tool_call_overhead.py`):
"thread" and "process" about 0.1 ms each; a child forked for each call instead (tried first: it would kill what a call
left running after every call) costs 2 to 12 ms there, 10 to 28 ms when the machine is loaded, as the page tables of
a large process are copied every time.

Deliberately not here: what a result means (`tracerl.io.env.rewards`, `tracerl.io.env.task_tools`), sandboxing
model-written code (`tracerl.io.sandbox`: this runner bounds time and output, not what the code may touch).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import io
import math
import numbers
import os
import pickle
import queue
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from decimal import Decimal
from multiprocessing.connection import Connection, Pipe
from typing import Any

import numpy as np

KINDS = ("process", "thread", "none")
MAX_RESULT_BYTES = 64 * 2**20  # a pickled result larger than this is a failed call (tools cut their text earlier)
MAX_PRINTED_CHARS = 20_000  # what one call may print to the trainer's stdout/stderr; the rest is dropped
MAX_STUCK_THREADS = 32  # abandoned threads still running before "thread" calls fail at once
ERROR_CHARS = 200  # of an exception's text carried back (as tool error observations always showed)


class CallFailed(Exception):
    """The call raised (the message is "Type: text", as the call raised it), died, or returned what cannot come
    back; the message says which."""


class CallTimeout(CallFailed):
    """The call ran past its deadline (and, in a process, was killed)."""


class ResultNotSent(CallFailed):
    """The call returned, in a process, a value that cannot be pickled back (a lock, a connection, a deep nest)."""


def finite_number(value: Any) -> float | None:
    """`float(value)` when `value` is a real number (bool, int, float, a numpy or Decimal scalar) finite as a float;
    else None. `10**400` is None: no float holds it (float() would raise OverflowError)."""
    if not isinstance(value, (numbers.Real, Decimal, np.bool_)):
        return None
    try:
        number = float(value)
    except (ArithmeticError, ValueError, TypeError):
        return None
    return number if math.isfinite(number) else None


def describe(value: Any) -> str:
    """`value` for an error message: its type and at most 80 characters of its repr (10**400 has 401 digits, and
    Python refuses to write an int of more than 4300)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"an int of {value.bit_length()} bits, too large for a float"
    try:
        text = repr(value)
    except Exception:  # a repr that raises
        text = "?"
    return f"{type(value).__name__} {text[:80]}"


def _error_text(err: BaseException) -> str:
    try:
        text = str(err)
    except Exception:  # an exception whose str() raises
        text = "(its message could not be read)"
    return f"{type(err).__name__}: {text[:ERROR_CHARS]}"


# ---------------------------------------------------------------- inside a child or worker process

class _CappedWriter(io.TextIOBase):
    """stdout/stderr of a child: writes through to the trainer's file descriptor until the budget is spent."""

    def __init__(self, fd: int, budget: list[int]) -> None:
        self.fd, self.budget = fd, budget  # the budget is shared by stdout and stderr

    def write(self, text: str) -> int:
        if self.budget[0] > 0:
            kept = text[: self.budget[0]]
            self.budget[0] -= len(kept)
            note = "" if self.budget[0] > 0 else "\n[tracerl: the rest of this call's output was dropped]\n"
            try:
                os.write(self.fd, (kept + note).encode("utf-8", "replace"))
            except OSError:
                self.budget[0] = 0
        return len(text)

    def writable(self) -> bool:
        return True


_IN_CHILD = False  # set in a child or worker: a call made there (a __del__ freeing a state) runs inline
try:  # loaded here, not in a fresh child: dlopen there could wait for ever on a lock another thread held at the fork
    _LIBC: Any = ctypes.CDLL(None, use_errno=True)
except OSError:  # not a platform with a C library to load this way: no kill-with-parent
    _LIBC = None


def kill_with_parent() -> bool:
    """Have the kernel kill this process when the thread that started it ends (Linux's PR_SET_PDEATHSIG = 1);
    False where that cannot be asked."""
    try:
        return _LIBC.prctl(1, signal.SIGKILL) == 0
    except Exception:
        return False


def _become_child() -> list[int]:
    """Setup in a fresh child: own process group, killed with the thread that started it, capped printing."""
    global _IN_CHILD
    _IN_CHILD = True
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    kill_with_parent()  # where it cannot be asked (not Linux), the deadline still bounds each call
    budget = [MAX_PRINTED_CHARS]
    sys.stdout, sys.stderr = _CappedWriter(1, budget), _CappedWriter(2, budget)
    return budget


def _outcome(fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> bytes:
    """The pickled ("ok", value) or ("failed", text) of one call, never larger than MAX_RESULT_BYTES."""
    try:
        payload: tuple = ("ok", fn(*args, **kwargs))
    except BaseException as err:  # noqa: BLE001 - everything a call raises is carried back as text
        payload = ("failed", _error_text(err))
    try:
        data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException as err:  # noqa: BLE001 - an unpicklable or too deeply nested result
        return pickle.dumps(("unsent", f"returned what cannot be sent back ({_error_text(err)})"))
    if len(data) > MAX_RESULT_BYTES:
        return pickle.dumps(("failed", f"returned {len(data)} bytes, more than the {MAX_RESULT_BYTES} a call may"))
    return data


def _serve(conn: Connection, inherited: Sequence[Callable[..., Any]]) -> None:
    """A "process" worker: run calls until the trainer closes the pipe (an int names one of `inherited`)."""
    budget = _become_child()
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        budget[0] = MAX_PRINTED_CHARS
        try:
            fn, args, kwargs = pickle.loads(data)
            fn = inherited[fn] if isinstance(fn, int) else fn
        except Exception as err:  # noqa: BLE001 - e.g. a function this process cannot import
            conn.send_bytes(pickle.dumps(("failed", f"could not be received by its worker ({_error_text(err)})")))
            continue
        conn.send_bytes(_outcome(fn, args, kwargs))


# ---------------------------------------------------------------- in the trainer

def _kill_group(pid: int) -> None:
    """SIGKILL to the process group `pid` leads (and to `pid`, should it not have made its group yet)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _end(pid: int, patience_s: float = 10.0) -> str:
    """Kill and reap child `pid`; how it ended, in words. A process that SIGKILL does not end within `patience_s`
    (stuck in the kernel, on a dead network file system) is left to a daemon thread to reap, so no caller waits."""
    _kill_group(pid)
    deadline = time.monotonic() + patience_s
    while True:
        try:
            reaped, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return "ended"
        if reaped:
            break
        if time.monotonic() > deadline:
            threading.Thread(target=os.waitpid, args=(pid, 0), daemon=True).start()
            return "did not end after SIGKILL (stuck in the kernel)"
        time.sleep(0.001)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"ended with exit status {code}"


class _WorkerDied(CallFailed):
    """The worker running the call ended before it answered (its status is read when it is reaped)."""


class _Unusable(CallFailed):
    """The call failed in a way that leaves its worker's pipe out of step: the worker is replaced."""


def _decode(data: bytes) -> Any:
    status, value = pickle.loads(data)
    if status != "ok":
        raise (ResultNotSent if status == "unsent" else CallFailed)(value)
    return value


class _Worker:
    """One long-lived "process" worker: its pid and its end of the pipe."""

    def __init__(self, inherited: Sequence[Callable[..., Any]]) -> None:
        ours, theirs = Pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                ours.close()
                _serve(theirs, inherited)
            finally:
                os._exit(0)
        theirs.close()
        self.conn, self.ended, self.inherited = ours, "", inherited

    def run(self, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any], timeout_s: float) -> Any:
        """One call; the caller stops this worker after a timeout or its death."""
        key: Any = next((i for i, f in enumerate(self.inherited) if f is fn), fn)
        try:
            data = pickle.dumps((key, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as err:  # noqa: BLE001 - the worker is fine; the call cannot reach it
            raise CallFailed(f"could not be sent to a worker process ({_error_text(err)})") from None
        try:
            self.conn.send_bytes(data)
        except OSError:
            raise _WorkerDied("its worker process died") from None
        if timeout_s and not self.conn.poll(timeout_s):
            raise CallTimeout(f"timed out after {timeout_s:g} s")
        try:
            data = self.conn.recv_bytes(MAX_RESULT_BYTES + 4096)
        except EOFError:
            raise _WorkerDied("its worker process died") from None
        except OSError as err:
            if "bad message length" in str(err):  # multiprocessing's words for a message over the cap
                raise _Unusable(f"returned more than the {MAX_RESULT_BYTES} bytes a call may") from None
            raise _WorkerDied("its worker process died") from None
        return _decode(data)

    def stop(self) -> str:
        """Kill and reap the worker, once (a pid is never signalled after it was reaped and may be reused). Only
        the worker thread that owns it calls this: its pipe is never closed under a read in another thread."""
        if not self.ended:
            self.conn.close()
            self.ended = _end(self.pid)
        return self.ended


class _Slots:
    """What a runner's worker threads share, apart from the runner (so a runner nobody holds is collected, and its
    finalizer stops them): the call queue, the "process" workers, the abandoned threads."""

    def __init__(self, kind: str, workers: int, timeout_s: float, label: str,
                 inherited: Sequence[Callable[..., Any]]) -> None:
        self.kind, self.timeout_s, self.label, self.inherited = kind, timeout_s, label, inherited
        self.calls: queue.SimpleQueue = queue.SimpleQueue()
        self.processes: list[_Worker | None] = [None] * workers
        self.stuck: list[threading.Thread] = []
        self.lock = threading.Lock()
        for slot in range(workers):
            threading.Thread(target=self.own, args=(slot,), daemon=True, name=f"tracerl-{label}-{slot}").start()

    def own(self, slot: int) -> None:
        """A worker thread: take calls from the queue and run them, each under its deadline."""
        while True:
            item = self.calls.get()
            if item is None:  # the runner closed: stop this slot's worker, between calls
                worker, self.processes[slot] = self.processes[slot], None
                if worker is not None:
                    worker.stop()
                return
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(self.run(slot, fn, args, kwargs))
            except BaseException as err:  # noqa: BLE001 - handed to the caller through the future
                future.set_exception(err)

    def run(self, slot: int, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        if self.kind == "thread":
            return self.in_thread(fn, args, kwargs)
        if self.processes[slot] is None:
            try:
                self.processes[slot] = _Worker(self.inherited)
            except OSError as err:  # out of processes or memory
                raise CallFailed(f"could not start a worker process: {_error_text(err)}") from None
        worker = self.processes[slot]
        try:
            return worker.run(fn, args, kwargs, self.timeout_s)
        except CallFailed as err:
            if not isinstance(err, (CallTimeout, _WorkerDied, _Unusable)):
                raise  # the call failed; its worker is fine
            self.processes[slot] = None
            ended = worker.stop()  # killed at its deadline, or found dead: the next call starts a fresh one
            if isinstance(err, _WorkerDied):
                raise CallFailed(f"its worker process {ended}") from None
            raise
        except BaseException:  # anything else leaves the worker in an unknown state
            self.processes[slot] = None
            worker.stop()
            raise

    def in_thread(self, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        with self.lock:
            self.stuck = [t for t in self.stuck if t.is_alive()]
            if len(self.stuck) >= MAX_STUCK_THREADS:
                raise CallFailed(f"{len(self.stuck)} earlier calls past their deadline still run in threads, which "
                                 "cannot be stopped; fix the code that hangs, or run it in processes")
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = fn(*args, **kwargs)
            except BaseException as err:  # noqa: BLE001 - handed to the caller
                box["error"] = err
        thread = threading.Thread(target=run, daemon=True, name=f"tracerl-{self.label}-call")
        thread.start()
        thread.join(self.timeout_s or None)
        if thread.is_alive():
            with self.lock:
                self.stuck.append(thread)
            raise CallTimeout(f"timed out after {self.timeout_s:g} s (its thread cannot be stopped and runs on)")
        if "error" in box:
            raise CallFailed(_error_text(box["error"])) from box["error"]
        return box["value"]

    def shut(self) -> None:
        """Cancel queued calls; each worker thread then ends its worker process, after its running call (which ends
        by its deadline). Never blocks: it may run as a finaliser, in any thread."""
        while True:
            try:
                item = self.calls.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in self.processes:
            self.calls.put(None)


class Runner:
    """Calls of user code, each with a deadline (`timeout_s`; 0: none, for callers that allow it), run as `kind`
    says (module docstring), on `workers` calls at once."""

    def __init__(self, kind: str, *, workers: int = 1, timeout_s: float = 10.0, label: str = "call",
                 inherited: Sequence[Callable[..., Any]] = ()) -> None:
        if kind not in KINDS:
            raise ValueError(f"{label} runner kind={kind!r}; use one of {KINDS}")
        self.kind, self.workers, self.timeout_s, self.label = kind, max(1, workers), timeout_s, label
        self.inherited = tuple(inherited)  # functions "process" workers hold from their fork: sent by index
        self._slots: _Slots | None = None
        self._finalizer: Any = None
        # reentrant: the garbage collector may run an object's __del__ that submits a call (UserTaskEnv freeing its
        # state) in the middle of this runner's own submit, in the same thread
        self._lock = threading.RLock()

    @property
    def num_stuck_threads(self) -> int:
        """Abandoned "thread" calls still running."""
        slots = self._slots
        return sum(t.is_alive() for t in slots.stuck) if slots else 0

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        """Start fn(*args, **kwargs); its future gives the result or raises CallFailed / CallTimeout."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        if self.kind == "none" or _IN_CHILD:  # inside a worker there are no worker threads to hand it to
            try:
                future.set_result(fn(*args, **kwargs))
            except Exception as err:
                future.set_exception(CallFailed(_error_text(err)))
            return future
        with self._lock:
            if self._slots is None:
                self._slots = _Slots(self.kind, self.workers, self.timeout_s, self.label, self.inherited)
                self._finalizer = weakref.finalize(self, self._slots.shut)
            slots = self._slots
        slots.calls.put((future, fn, args, kwargs))
        return future

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """fn(*args, **kwargs) under this runner's bounds, waited for."""
        return self.submit(fn, *args, **kwargs).result()

    def close(self) -> None:
        """Cancel queued calls; each worker process is killed (with what it left running) as soon as its running
        call, if any, is over. A later call starts fresh workers."""
        with self._lock:
            if self._finalizer is not None:
                self._finalizer()
            self._slots = self._finalizer = None
