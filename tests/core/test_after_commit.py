"""The after-commit helper the live feed and the runners' push notices share
(core/after_commit.py): what is noted in a transaction runs once after commit, never after
a rollback; one thread per process sends it; messages carry the Redis database."""

from __future__ import annotations

import threading

import pytest
from django.db import transaction
from django.test import override_settings

from core import after_commit

pytestmark = pytest.mark.django_db(transaction=True)


class Noted:
    """A collector: what one transaction noted; `runs` records each on-commit run."""

    runs: list[set[int]] = []

    def __init__(self) -> None:
        self.ids: set[int] = set()

    def __call__(self) -> None:
        Noted.runs.append(set(self.ids))


@pytest.fixture(autouse=True)
def _clear_runs():
    Noted.runs = []


def test_one_collector_per_transaction_run_once_after_commit():
    with transaction.atomic():
        after_commit.note(Noted, lambda c: c.ids.add(1))
        with transaction.atomic():  # a savepoint shares the outer transaction's collector
            after_commit.note(Noted, lambda c: c.ids.add(2))
        assert Noted.runs == []  # nothing before the commit
    assert Noted.runs == [{1, 2}]


def test_a_rollback_runs_nothing_and_a_rolled_back_savepoint_takes_its_collector():
    def noted_then_failed(item: int) -> None:
        with transaction.atomic():
            after_commit.note(Noted, lambda c: c.ids.add(item))
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        noted_then_failed(1)
    assert Noted.runs == []
    with transaction.atomic():
        with pytest.raises(RuntimeError):
            noted_then_failed(3)  # a savepoint
        assert after_commit.registered(Noted) is None
        after_commit.note(Noted, lambda c: c.ids.add(4))
    assert Noted.runs == [{4}]


def test_outside_a_transaction_it_runs_at_once():
    after_commit.note(Noted, lambda c: c.ids.add(5))
    assert Noted.runs == [{5}]


class Collecting(after_commit.AfterCommitThread[int]):
    """Takes rounds of items once `gate` is set; records each round."""

    def __init__(self) -> None:
        super().__init__("test-after-commit")
        self.gate = threading.Event()
        self.rounds: list[list[int]] = []
        self.thread_names: set[str] = set()

    def run(self) -> None:
        while True:
            self.gate.wait()
            items = self.take()
            self.rounds.append(items)
            self.thread_names.add(threading.current_thread().name)
            self.done(len(items))


def test_the_thread_merges_what_queued_meanwhile_and_flush_waits_for_it():
    sender = Collecting()
    for item in range(3):
        sender.submit(item)
    assert sender.flush(0.05) is False  # held at the gate: not sent yet
    sender.gate.set()
    assert sender.flush(5)
    assert sender.rounds == [[0, 1, 2]]  # one round: queued meanwhile, taken together
    assert sender.thread_names == {"test-after-commit"}


def test_per_process_makes_one_and_reset_forgets_it():
    made = []
    holder = after_commit.PerProcess(lambda: made.append(object()) or made[-1])
    assert holder.get() is holder.get() is made[0]
    holder.reset()
    assert holder.get() is made[1]


def test_local_counter_numbers_per_group():
    counter = after_commit.LocalCounter()
    assert counter.get("a") == 0
    assert counter.incr_many(["a", "b", "a"]) == [1, 1, 2]
    assert counter.incr("a") == 3
    assert counter.get("b") == 1


def test_namespace_is_the_redis_database():
    with override_settings(REDIS_URL="redis://127.0.0.1:6379/7"):
        assert after_commit.namespace() == "7"
    with override_settings(REDIS_URL="redis://127.0.0.1:6379"):
        assert after_commit.namespace() == "0"
    with override_settings(REDIS_URL=""):
        assert after_commit.namespace() == ""
