"""Stopping a sweep on Ctrl-C (and SIGTERM): the first lets the blocks in flight finish and be
saved, a second gives them up at once; a chunk computes in a worker thread so the main thread's
signal handlers run within a fraction of a second whatever the chunk's length."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import threading
import time
from collections.abc import Callable


class Abandoned(KeyboardInterrupt):
    """A second Ctrl-C while a chunk was being computed: its blocks in flight are given up (not
    saved; a resumed sweep runs them again) and the sweep stops at once."""


class AbandonedCompile(Abandoned):
    """A second Ctrl-C while a program was compiling: the compile is given up (nothing to save)
    and the sweep stops at once."""


# A second SIGINT this soon after the first is the same one delivered twice (GNU timeout sends
# its signal to the command and then to the process group); a person's second Ctrl-C takes
# longer than this.
ECHO_S = 0.02


@dataclasses.dataclass
class Interrupt:
    stop: bool = False  # a Ctrl-C came: stop before the next chunk
    saving: bool = False  # a chunk is being computed and written: let it finish
    computing: bool = False  # its blocks are computing (a second Ctrl-C gives them up)
    compiling: bool = False  # a program is compiling (stop when it returns; again: give it up)
    first_at: float = -1.0  # time.monotonic() of the first Ctrl-C


def in_worker(fn: Callable, *args):
    """``fn(*args)`` in a daemon thread while this (main) thread waits in short sleeps, so a signal
    handler runs within ~0.1 s even while a compiled block computes for minutes (a C call in
    the main thread would hold it off until the block returns). Re-raises what ``fn`` raised."""
    return Background(fn, *args, daemon=True).result()


class Background:
    """``fn(*args)`` started in a thread of its own (a compile beside the runs, or a chunk:
    :func:`in_worker`). A compile's thread is not a daemon: an interpreter that exits waits for
    it rather than tearing JAX down under a running compile. :meth:`result` waits in short
    sleeps, so signal handlers run meanwhile."""

    def __init__(self, fn: Callable, *args, daemon: bool = False):
        self.box: dict = {}
        self.done = threading.Event()
        self.seconds = 0.0

        def work():
            t = time.perf_counter()
            try:
                self.box["out"] = fn(*args)
            except BaseException as e:  # handed to the waiting thread
                self.box["err"] = e
            finally:
                self.seconds = time.perf_counter() - t
                self.done.set()

        threading.Thread(target=work, daemon=daemon,
                         name="phasebo-chunk" if daemon else "phasebo-compile").start()

    def result(self):
        while not self.done.wait(0.1):
            pass
        if "err" in self.box:
            raise self.box["err"]
        return self.box["out"]


class SigintLatch:
    """A SIGINT handler for a command's start (:meth:`install`): it raises KeyboardInterrupt as
    Python's own does, and remembers that it did, so that a Ctrl-C Python swallowed (raised
    inside a garbage-collector callback, which jax registers, while a program is traced) still
    stops the sweep when :func:`interruptible` takes over."""

    def __init__(self):
        self.hit = False
        self.last = -1.0  # time.monotonic() of the last Ctrl-C handled (here or in a chunk loop)

    def __call__(self, signum, frame):
        if time.monotonic() - self.last < ECHO_S:
            return  # the same Ctrl-C again (timeout's second delivery): already stopping
        self.hit, self.last = True, time.monotonic()
        raise KeyboardInterrupt

    @classmethod
    def install(cls) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, cls())


@contextlib.contextmanager
def interruptible():
    """SIGINT sets ``stop``, which the chunk loop reads before every chunk; outside a chunk's
    compute and writes it also raises KeyboardInterrupt at once (a compile or the plan stops
    there). A chunk being computed when the Ctrl-C comes dispatches no further block, finishes
    the blocks in flight and is saved first (its runs are then done); a second Ctrl-C meanwhile
    raises :class:`Abandoned` at once (a stiff flow's block can take minutes). (The flag also
    stops the sweep when Python swallows the exception, as it does inside a garbage-collector
    callback, which jax registers.)"""
    state = Interrupt()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def handler(signum, frame):
        if state.stop and time.monotonic() - state.first_at < ECHO_S:
            return  # the same Ctrl-C twice: `timeout -s INT` signals the process, then its group
        try:
            stop(signum)
        finally:  # stamped once handled (its message printed): a slow stderr is not a pause
            state.first_at = time.monotonic()

    def stop(signum):
        if state.stop and state.compiling:
            raise AbandonedCompile
        if state.stop and state.computing:
            raise Abandoned
        first, state.stop = not state.stop, True
        # the command line stops on SIGTERM as on Ctrl-C (cli.sweep.SigtermAsSigint); Python not
        again = "Ctrl-C or SIGTERM" if getattr(signal.getsignal(signal.SIGTERM),
                                               "stops_as_ctrl_c", False) else "Ctrl-C"
        if state.compiling:
            print(f"\nstopping once the program being compiled is ready ({again} again: at "
                  "once)", file=sys.stderr, flush=True)
            return
        if not state.saving:
            raise KeyboardInterrupt
        if first and state.computing:
            print(f"\nstopping: the blocks in flight finish and are saved ({again} again: at "
                  "once; their runs are redone on resume)", file=sys.stderr, flush=True)

    old = signal.signal(signal.SIGINT, handler)
    latch = old if isinstance(old, SigintLatch) else None
    state.stop = latch is not None and latch.hit  # a Ctrl-C before, maybe swallowed
    state.first_at = latch.last if latch is not None else -1.0  # its echo is no second Ctrl-C
    try:
        yield state
    finally:
        if latch is not None and state.stop:  # an echo after the loop hands back: one Ctrl-C
            latch.last = max(latch.last, state.first_at)
        signal.signal(signal.SIGINT, old)
