"""One thread owns the store's connection (SQLite or PostgreSQL) and commits in groups.

Handlers on the event loop hand over their ops and await the commit; the thread drains whatever
has queued meanwhile into one transaction. So ingest never blocks the loop on disk, a 200 means
"committed", and a busy second costs a few commits instead of one per request.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, Callable, Sequence, TypeVar

from podhealth.aggregator.store import Op, Store, db_errors
from podhealth.worker import offload, settle_from_thread

T = TypeVar("T")
_MAX_BATCH = 512
_STOP = object()


class Writer:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="podhealth-db-writer", daemon=True)
        self._started = False
        self.commits = 0
        self.failures = 0  # writes the database refused (commits and called writes alike)
        # The last write's error ("" after a success): /healthz says the store cannot write while
        # it is set, so a full disk is seen before an operator's fence fails on it.
        self.error = ""

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    async def stop(self) -> None:
        if self._started:
            self._q.put(_STOP)
            await offload(self._thread.join, 30.0)
            self._started = False

    def write(self, ops: Sequence[Op], epoch: int | None = None) -> "asyncio.Future[None]":
        """Queue ops; the future resolves once they are committed (or fails with the error).
        With `epoch` (the fencing token, replicas on PostgreSQL) they commit only while it is
        the lease's (else StaleEpoch); such writes still commit in groups, among themselves."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not ops:
            fut.set_result(None)
            return fut
        if epoch is None:
            self._q.put(("ops", list(ops), fut))
        else:
            self._q.put(("epoch_ops", (epoch, list(ops)), fut))
        return fut

    def write_nowait(self, ops: Sequence[Op]) -> None:
        """Queue ops nobody waits for (periodic last-seen flushes); a failure is only counted."""
        if ops:
            self._q.put(("ops", list(ops), None))

    def call(self, fn: Callable[[Store], T]) -> "asyncio.Future[T]":
        """Run fn(store) in the writer thread, after everything queued before it."""
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._q.put(("call", fn, fut))
        return fut

    # ---- the thread --------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is _STOP:
                return
            batch = [item]
            stop = False
            while len(batch) < _MAX_BATCH:
                try:
                    nxt = self._q.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                    break
                batch.append(nxt)
            self._process(batch)
            if stop:
                return

    def _process(self, batch: list[Any]) -> None:
        group: list[tuple[list[Op], Any]] = []
        key: int | None = None  # the epoch the group's writes are guarded by (None: unguarded)
        for kind, payload, fut in batch:
            if kind in ("ops", "epoch_ops"):
                epoch, ops = (None, payload) if kind == "ops" else payload
                if group and epoch != key:  # in queue order: a guarded run is its own transaction
                    self._commit(group, key)
                    group = []
                key = epoch
                group.append((ops, fut))
                continue
            self._commit(group, key)
            group = []
            try:
                result = payload(self.store)
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
                if isinstance(e, db_errors()):  # a write the database refused, counted like a commit's
                    self.failures += 1
                    self.error = f"{type(e).__name__}: {e}"
                self._resolve(fut, None, e)
            else:
                self._resolve(fut, result, None)
        self._commit(group, key)

    def _commit(self, group: list[tuple[list[Op], Any]], epoch: int | None = None) -> None:
        if not group:
            return
        try:
            ops = (op for items, _ in group for op in items)
            if epoch is None:
                self.store.apply(ops)
            else:
                self.store.apply(ops, epoch=epoch)
            self.commits += 1
            self.error = ""
        except Exception as err:
            # One bad op must not fail its neighbours: retry each request on its own.
            if len(group) > 1:
                for one in group:
                    self._commit([one], epoch)
                return
            self.failures += 1
            self.error = f"{type(err).__name__}: {err}"
            for _, fut in group:
                self._resolve(fut, None, err)
            return
        for _, fut in group:
            self._resolve(fut, None, None)

    @staticmethod
    def _resolve(fut: "asyncio.Future[Any] | None", result: Any, err: BaseException | None) -> None:
        if fut is not None:
            settle_from_thread(fut, result, err)
