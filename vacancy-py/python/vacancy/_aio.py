"""asyncio admission: ``Engine.admit_async`` and ``Engine.admitting``.

An admission is stepped on the event loop's thread (``AdmitTicket.step``
never blocks: the engine's lock is held for microseconds). While it waits for
the post-job sample or its turn in the wait line, the task awaits a future
that one waker thread per engine resolves when the engine changes after that
step (a sample lands, the line moves; it waits in Rust with the GIL released),
or the wait's own deadline passes. The step reads the engine's change
generation under the lock it decides under, and every change moves the
generation under that lock, so no change between a step and its wait is
missed, and no task is woken without one. Because the reservation is only
ever made by a ``step`` on the loop's thread, a cancelled task cannot leave
one behind: the cancellation arrives at the ``await`` and leaves the wait line.
"""

from __future__ import annotations

import asyncio
import threading
import types
import weakref

from vacancy._vacancy import AdmitTicket, Engine, Reservation

__all__ = ["Admitting", "admit"]

# How long the waker thread blocks before it looks whether anyone still
# waits (it ends when no one does). Never a waiting task's wake-up.
_IDLE_CHECK_S = 1.0


class _Waker:
    """One thread per engine that resolves waiting tasks' futures on changes."""

    def __init__(self, engine: Engine) -> None:
        self._engine = weakref.ref(engine)
        self._lock = threading.Lock()
        # (generation seen at the step, loop, future)
        self._waiting: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._thread: threading.Thread | None = None

    def changed(self, generation: int) -> asyncio.Future[None]:
        """A future resolved once the engine's generation moves past ``generation``."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        engine = self._engine()
        if engine is None or engine._generation() != generation:
            fut.set_result(None)  # it changed already: ask again now
            return fut
        with self._lock:
            self._waiting.append((generation, loop, fut))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="vacancy-async-waker", daemon=True
                )
                self._thread.start()
        return fut

    def _run(self) -> None:
        while True:
            with self._lock:
                self._waiting = [w for w in self._waiting if not w[2].done()]
                if not self._waiting:
                    self._thread = None
                    return
                seen = min(g for g, _, _ in self._waiting)
            engine = self._engine()
            if engine is None:
                return
            now = engine._wait_change(seen, _IDLE_CHECK_S)
            del engine
            if now == seen:
                continue  # no change: only look who still waits
            with self._lock:
                ready = [w for w in self._waiting if w[0] < now]
                self._waiting = [w for w in self._waiting if w[0] >= now]
            for _, loop, fut in ready:
                try:
                    loop.call_soon_threadsafe(_resolve, fut)
                except RuntimeError:  # the loop closed meanwhile
                    pass


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


_wakers: weakref.WeakKeyDictionary[Engine, _Waker] = weakref.WeakKeyDictionary()
_wakers_lock = threading.Lock()


def _waker(engine: Engine) -> _Waker:
    with _wakers_lock:
        w = _wakers.get(engine)
        if w is None:
            w = _wakers[engine] = _Waker(engine)
        return w


async def admit(ticket: AdmitTicket) -> Reservation:
    """Step ``ticket`` until admitted or refused, awaiting changes between steps."""
    waker: _Waker | None = None
    try:
        while True:
            step = ticket.step()
            if isinstance(step, Reservation):
                return step
            generation, wait_s = step
            if waker is None:
                waker = _waker(ticket.engine)
            changed = waker.changed(generation)
            try:
                # A change, or the wait's deadline: then ask again.
                await asyncio.wait_for(changed, timeout=max(wait_s, 0.0))
            except TimeoutError:
                pass
    except BaseException:
        # Cancelled (or the coroutine closed, or refused): leave the wait line.
        # Nothing was reserved: only a step on this thread reserves, and it
        # returned a wait or raised.
        ticket.cancel()
        raise


class Admitting:
    """``async with engine.admitting(...) as job``: admitted on entry; on exit
    released as ``Reservation``'s ``with`` block releases (clean: completed;
    an exception, cancellation included: held as uncertain)."""

    def __init__(self, ticket: AdmitTicket) -> None:
        self._ticket = ticket
        self._job: Reservation | None = None

    async def __aenter__(self) -> Reservation:
        self._job = await admit(self._ticket)
        return self._job

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        job, self._job = self._job, None
        if job is not None:
            job.__exit__(exc_type, exc, tb)
