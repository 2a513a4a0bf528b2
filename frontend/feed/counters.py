"""The live feed's sequence numbers, one counter per group, tagged with the Redis run id
(the epoch), and the cross-process depth slot; on the channel layer's Redis (REDIS_URL),
without it in the embedded default layer's SQLite file (its id the epoch), or in this
process (the in-memory layer). Why numbers only grow across a Redis restart, and how the
depth slot works: docs/FEED_PROTOCOL.md (Epochs; Depth coalescing).

Shapes: `next_many(groups) -> (epoch, [seq, ...])`, `read(group) -> (epoch, seq)`;
epoch "" for the in-process counter (it never resets while the process lives).
Errors: redis.exceptions.ConnectionError / TimeoutError while Redis is unreachable;
sqlite3.OperationalError while the layer's file stays locked.
"""

from __future__ import annotations

import time

import redis
from django.conf import settings

from core.after_commit import LocalCounter, PerProcess, redis_url
from core.sqlite_layer import Store
from frontend.feed.local import _hubs

DEPTH_PUBLISH, DEPTH_COVERED, DEPTH_WAIT = "publish", "covered", "wait"


def _floor() -> int:
    """Where a reset counter starts: now, in microseconds since the epoch."""
    return time.time_ns() // 1000


class _LocalCounter(LocalCounter):
    def read(self, group: str) -> tuple[str, int]:
        return "", self.get(group)

    def next_many(self, groups: list[str]) -> tuple[str, list[int]]:
        return "", self.incr_many(groups)

    def run_id(self) -> str:
        return ""

    # one process publishes everything: no depth coordination between processes
    def depth_changes(self, market_pks: list[int]) -> dict[int, int]:
        return dict.fromkeys(market_pks, 0)

    def depth_turn(self, market_pk: int, need: int, interval: float) -> tuple[str, float]:
        return DEPTH_PUBLISH, 0

    def depth_done(self, market_pk: int, covers: float) -> None:
        pass

    def listening_users(self) -> set[int]:
        """Users with a /ws/me/ subscriber: in-memory layer, so in this process's hubs."""
        return {int(group[len("user."):]) for hub in list(_hubs.values())
                for group in list(hub.groups) if group.startswith("user.")}

    def listening_among(self, user_ids: set[int]) -> set[int]:
        """Those of `user_ids` with a /ws/me/ subscriber (what the publisher asks)."""
        return set(user_ids) & self.listening_users() if user_ids else set()


class _RedisCounter:
    PREFIX = "gpumarket:feed:seq:"       # the group's last number (a plain integer)
    RUN = "gpumarket:feed:seq-run:"      # the run id of the Redis that numbered it

    # KEYS: (counter, run) per group; ARGV[1]: the floor (decimal µs); ARGV[2]: '1' to
    # take the next number, '0' to read the last one. Returns {run id, number per group}.
    _NEXT = """
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
local out = {run}
for i = 1, #KEYS, 2 do
  local seq = redis.call('GET', KEYS[i])
  if not seq or redis.call('GET', KEYS[i + 1]) ~= run then
    if not seq or tonumber(seq) < tonumber(ARGV[1]) then
      seq = ARGV[1]
      redis.call('SET', KEYS[i], seq)
    end
    redis.call('SET', KEYS[i + 1], run)
  end
  if ARGV[2] == '1' then seq = redis.call('INCR', KEYS[i]) end
  out[#out + 1] = seq
end
return out
"""

    def __init__(self, url: str) -> None:
        self._redis = redis.Redis.from_url(url)

    def _numbers(self, groups: list[str], take: bool) -> tuple[str, list[int]]:
        keys = [key for group in groups for key in (self.PREFIX + group, self.RUN + group)]
        run, *seqs = self._scripts("_NEXT")(keys=keys, args=[_floor(), 1 if take else 0])
        return run.decode(), [int(v) for v in seqs]

    def next_many(self, groups: list[str]) -> tuple[str, list[int]]:
        """The next number of each group (a group listed twice gets two), in one round
        trip, and the epoch (the Redis run id) they belong to."""
        return self._numbers(groups, True) if groups else (self.run_id(), [])

    def incr_many(self, groups: list[str]) -> list[int]:
        return self.next_many(groups)[1]

    def incr(self, group: str) -> int:
        return self.next_many([group])[1][0]

    def read(self, group: str) -> tuple[str, int]:
        """(epoch, the group's last number): the next event of the group gets a higher one."""
        run, [seq] = self._numbers([group], False)
        return run, seq

    def get(self, group: str) -> int:
        return self.read(group)[1]

    def run_id(self) -> str:
        return str(self._redis.info("server")["run_id"])

    # Depth coalescing across processes (docs/FEED_PROTOCOL.md, Depth coalescing): per
    # market one hash (`changes`: HINCRBY after commit; `covered`) and a slot key whose PX
    # is the interval.
    DEPTH = "gpumarket:feed:depth:"
    _TURN = """
local covered = tonumber(redis.call('HGET', KEYS[1], 'covered') or '0')
if covered >= tonumber(ARGV[1]) then return {0, 0} end
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[2]) then
  return {1, tonumber(redis.call('HGET', KEYS[1], 'changes') or '0')}
end
return {2, redis.call('PTTL', KEYS[2])}
"""
    _DONE = """
local covered = tonumber(redis.call('HGET', KEYS[1], 'covered') or '0')
if tonumber(ARGV[1]) > covered then redis.call('HSET', KEYS[1], 'covered', ARGV[1]) end
return 0
"""

    def depth_changes(self, market_pks: list[int]) -> dict[int, int]:
        pipe = self._redis.pipeline(transaction=False)
        for pk in market_pks:
            pipe.hincrby(f"{self.DEPTH}{pk}", "changes", 1)
        return {pk: int(v) for pk, v in zip(market_pks, pipe.execute(), strict=True)}

    def depth_turn(self, market_pk: int, need: int, interval: float) -> tuple[str, float]:
        """(DEPTH_COVERED, 0): another process published a depth read after change
        `need`; (DEPTH_PUBLISH, covers): this process holds the slot, and its depth, read
        from now on, covers every change numbered <= covers; (DEPTH_WAIT, seconds): another
        process holds the slot for that long."""
        turn = self._scripts("_TURN")
        verdict, value = turn(keys=[f"{self.DEPTH}{market_pk}", f"{self.DEPTH}{market_pk}:slot"],
                              args=[need, max(1, int(interval * 1000))])
        if verdict == 0:
            return DEPTH_COVERED, 0
        if verdict == 1:
            return DEPTH_PUBLISH, int(value)
        return DEPTH_WAIT, max(0.001, int(value) / 1000)

    def depth_done(self, market_pk: int, covers: float) -> None:
        self._scripts("_DONE")(keys=[f"{self.DEPTH}{market_pk}"], args=[int(covers)])

    @staticmethod
    def _user_channel_prefix() -> str:
        # channels_redis names a group's pub/sub channel `<prefix>__group__<group>`
        config = settings.CHANNEL_LAYERS["default"].get("CONFIG", {})
        return f"{config.get('prefix', 'asgi')}__group__user."

    def listening_among(self, user_ids: set[int]) -> set[int]:
        """Those of `user_ids` with a /ws/me/ subscriber in any process: one PUBSUB
        NUMSUB of their groups' channels, O(len(user_ids)) whatever the number of
        subscribers (PUBSUB CHANNELS, which lists them all, cost 37 ms a round with
        10,000 users: bench/README.md, "Live feed at fleet size"). Pub/sub spans every
        Redis database: another deployment's user of the same id counts too, which only
        costs a message."""
        if not user_ids:
            return set()
        prefix = self._user_channel_prefix()
        ids = sorted(user_ids)
        counts = self._redis.pubsub_numsub(*(f"{prefix}{u}" for u in ids))
        return {u for u, (_, n) in zip(ids, counts, strict=True) if int(n) > 0}

    def listening_users(self) -> set[int]:
        """Every user with a /ws/me/ subscriber in any process (lists every user
        channel: O(subscribers); the publisher asks `listening_among` instead)."""
        pattern = self._user_channel_prefix()
        users = set()
        for channel in self._redis.pubsub_channels(pattern + "*"):
            tail = channel.decode()[len(pattern):]
            if tail.isdigit():
                users.add(int(tail))
        return users

    def _scripts(self, name: str):
        cache = self.__dict__.setdefault("_registered", {})
        if name not in cache:
            cache[name] = self._redis.register_script(getattr(self, name))
        return cache[name]


class _FileCounter(_LocalCounter):
    """Numbers in the SQLite file of the embedded default's channel layer
    (core/sqlite_layer.py), shared by every process using that file; its epoch is the
    file's id. Depth is coalesced per process (each publishes a depth read after its own
    changes: correct, at most one depth per interval per process)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.store = Store(path)

    def read(self, group: str) -> tuple[str, int]:
        epoch, [seq] = self.store.numbers([group], _floor(), take=False)
        return epoch, seq

    def get(self, group: str) -> int:
        return self.read(group)[1]

    def next_many(self, groups: list[str]) -> tuple[str, list[int]]:
        return self.store.numbers(groups, _floor(), take=True)

    def incr_many(self, groups: list[str]) -> list[int]:
        return self.next_many(groups)[1]

    def run_id(self) -> str:
        return self.store.epoch()

    def listening_users(self) -> set[int]:
        """Users with a /ws/me/ subscriber in any process using the file."""
        return {int(group[len("user."):]) for group in self.store.groups_like("user.")
                if group[len("user."):].isdigit()}


def _file_layer_path() -> str | None:
    """The file of the default channel layer when it is core/sqlite_layer.py's."""
    config = settings.CHANNEL_LAYERS.get("default", {})
    if str(config.get("BACKEND", "")).endswith("sqlite_layer.SQLiteChannelLayer"):
        return str(config.get("CONFIG", {})["path"])
    return None


def _make_counter() -> _LocalCounter | _RedisCounter:
    url = redis_url()
    if url:
        return _RedisCounter(url)
    path = _file_layer_path()
    return _FileCounter(path) if path else _LocalCounter()


def _counter_key() -> tuple[str, str | None]:
    return redis_url(), _file_layer_path()


_counter: PerProcess[_LocalCounter | _RedisCounter] = PerProcess(_make_counter,
                                                                 key=_counter_key)


def counter() -> _LocalCounter | _RedisCounter:
    """The sequence counter: Redis (REDIS_URL, the channel layer's server), the embedded
    default's layer file, or in-process (the in-memory layer); made again whenever those
    settings change (a hub's thread never keeps an old server's)."""
    return _counter.get()


def reset() -> None:
    """Forget the counter, so the next use follows the current REDIS_URL (tests)."""
    _counter.reset()


def current_seq(group: str) -> int:
    return counter().get(group)


def current(group: str) -> tuple[str, int]:
    """(epoch, last number) of `group`. Blocking (Redis)."""
    return counter().read(group)
