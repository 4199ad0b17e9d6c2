"""asyncio admission: ``Engine.admit_async`` and ``Engine.admitting``.

An admission is stepped on the event loop's thread (``AdmitTicket.step``
never blocks: the engine's lock is held for microseconds). While it waits for
the post-job sample or its turn in the wait line, the task awaits a future
that one waker thread per engine resolves when a sample lands or the line
moves (it waits in Rust with the GIL released), or after 100 ms at most, so a
deadline is noticed in time. Because the reservation is only ever made by a
``step`` on the loop's thread, a cancelled task cannot leave one behind: the
cancellation arrives at the ``await`` and leaves the wait line.
"""

from __future__ import annotations

import asyncio
import threading
import types
import weakref

from vacancy._vacancy import AdmitTicket, Engine, Reservation

__all__ = ["Admitting", "admit"]

# The longest a waiting task sleeps without asking again (deadlines, refusals
# that need no wakeup such as the 4 s post-job bound).
_RECHECK_S = 0.1


class _Waker:
    """One thread per engine that resolves the futures of waiting tasks on every change."""

    def __init__(self, engine: Engine) -> None:
        self._engine = weakref.ref(engine)
        self._lock = threading.Lock()
        self._waiting: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._thread: threading.Thread | None = None

    def changed(self) -> asyncio.Future[None]:
        """A future resolved at the next change (or within ``_RECHECK_S``)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self._waiting.append((loop, fut))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="vacancy-async-waker", daemon=True
                )
                self._thread.start()
        return fut

    def _run(self) -> None:
        engine = self._engine()
        if engine is None:
            return
        seen = engine._generation()
        while True:
            seen = engine._wait_change(seen, _RECHECK_S)
            with self._lock:
                waiting, self._waiting = self._waiting, []
                if not waiting:
                    self._thread = None
                    return
            for loop, fut in waiting:
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
            job = ticket.step()
            if job is not None:
                return job
            if waker is None:
                waker = _waker(ticket.engine)
            await waker.changed()
    except BaseException:
        # Cancelled (or the coroutine closed, or refused): leave the wait line.
        # Nothing was reserved: only a step on this thread reserves, and it
        # returned None or raised.
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
