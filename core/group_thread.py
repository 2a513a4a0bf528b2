"""A thread that serves its queue in groups, for requests awaiting on event loops (the web
process's bid and heartbeat batchers: marketplace/api/bid_batcher.py, heartbeat_batch.py).
Started on first use; a None in the queue stops it after the group at hand and closes the
thread's database connection. Each queued
item carries the `loop` and `future` of the request waiting for it."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from typing import Any

from django.db import connection

log = logging.getLogger("gpumarket.api")


class GroupThread:
    """Subclasses set `thread_name` and `item_name` and write `_serve`."""

    thread_name = "group-thread"
    item_name = "request"

    def __init__(self, max_batch: int) -> None:
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self.thread_name,
                                                daemon=True)
                self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Let the thread finish what is queued and end (a later request starts a new
        one)."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._queue.put(None)
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                connection.close()  # the thread's own database connection
                return
            group = take_group(self._queue, first, self.max_batch)
            outcomes = self._serve(group)
            for pending, outcome in zip(group, outcomes, strict=True):
                try:
                    pending.loop.call_soon_threadsafe(_settle, pending.future, outcome)
                except RuntimeError:  # that request's event loop is closed (shutdown)
                    log.warning("a %s's answer could not be delivered: its loop is closed",
                                self.item_name)

    def _serve(self, group: list[Any]) -> list[Any]:
        """The outcome of each item of `group`, in order: a result or an exception."""
        raise NotImplementedError


def take_group(pending: queue.SimpleQueue, first: Any, max_batch: int) -> list[Any]:
    """`first` and whatever else `pending` holds now, at most `max_batch` in all; a None
    met (the stop) is put back, so the thread stops after this group."""
    group = [first]
    while len(group) < max_batch:
        try:
            item = pending.get_nowait()
        except queue.Empty:
            break
        if item is None:
            pending.put(None)
            break
        group.append(item)
    return group


def _settle(future: asyncio.Future, outcome: Any) -> None:
    if future.cancelled():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
