"""gpumarket settings, read from the environment (django-environ).

Every setting has a safe local default so `make demo` works on a fresh machine;
production sets DEBUG=0 and must then give SECRET_KEY (or SECRET_KEY_FILE).

Variables (default in brackets):
- DEBUG [1]: Django debug mode.
- SECRET_KEY or SECRET_KEY_FILE [generated into var/secret_key, only when DEBUG].
- GPUMARKET_SECRETS_KEY [required when DEBUG is off; with DEBUG, a development key
  derived from SECRET_KEY]: the Fernet key(s) that seal bids' `secrets` and leases'
  Jupyter tokens at rest, comma-separated: the first seals, every one opens
  (MultiFernet rotation; docs/SECRETS.md).
- DATABASE_URL [sqlite:///var/gpumarket.sqlite3]: PostgreSQL in production and tests.
- REDIS_URL [unset: a channel layer on the file var/channels.sqlite3]: channel layer;
  Celery broker too unless CELERY_BROKER_URL is set.
- CELERY_BROKER_URL [REDIS_URL, else a filesystem:// queue under var/celery].
- GPUMARKET_CELERY_QUEUES [0]: 1 routes each kind of task to its queue (`market`,
  `leases`, `ledger`; docs/SCALING.md): workers then need `-Q`. 0: all on `celery`.
- GPUMARKET_TAKE_RATE_BPS [1500]: platform fee in basis points (15 %).
- GPUMARKET_DEV_CREDIT [0]: enables POST /api/v1/wallet/dev-credit/ (demo and tests
  only; refused when DEBUG is off).
- GPUMARKET_DEFAULT_IMAGE [gpumarket/busybox:local]: image of a lease that names none.
- GPUMARKET_LEASE_GRACE_SECONDS [30]: how long past ends_at the marketplace waits for
  the runner before ending a lease itself.
- GPUMARKET_METER_INTERVAL_SECONDS [3600]: how often running leases are charged.
- GPUMARKET_LEASE_END_BATCH [200]: the most overdue leases of one market the worker's
  sweep ends together (settled 50 to a transaction, then their GPUs re-matched once;
  marketplace/lease_end.py); an integer >= 1.
- GPUMARKET_REMATCH_REPAIR_SECONDS [60]: how old an ask's pending re-match after a batch
  of lease ends must be before the beat's repair sweep runs it (a worker died between
  the batch's commit and its re-match; docs/MATCHING.md).
- GPUMARKET_PREEMPTION_NOTICE_SECONDS [120]: notice an interruptible lease gets between
  being outbid and being preempted (docs/MATCHING.md, "Preemption").
- GPUMARKET_MARKET_LOCK_TIMEOUT_MS [5000]: the longest a writer waits for a market's
  lock; then a 503 "the market … is busy" and nothing written (0: wait forever).
- GPUMARKET_TEMPLATE_IMAGES [none]: an image per template in place of templates.json's
  (a registry mirror, or `pytorch-jupyter=gpumarket/jupyter:local` on a site with no
  registry), as a JSON object or id=image,id=image; an unknown id, `custom` or a bad
  image reference stops the start (marketplace/template_images.py).
- GPUMARKET_IMAGE_ALLOW_PRIVATE_REGISTRY [0: an image whose registry is `localhost` or a
  private, loopback, link-local, unspecified or multicast IP literal is refused (400 naming
  `image`); host names are not resolved] (docs/IMAGES.md, "Private registries").
- GPUMARKET_BID_QUEUE [redis with REDIS_URL, else process]: redis — one batcher per
  market whatever the number of web processes (a per-market queue on Redis drained by
  the process holding the market's lease: marketplace/api/bid_queue.py); process — each
  web process groups its own bids. GPUMARKET_BID_QUEUE_LEASE_MS [5000]: a dead
  consumer's queue is taken over after this; GPUMARKET_BID_QUEUE_TIMEOUT_SECONDS [30]:
  a bid not placed by then is not placed (503).
- GPUMARKET_BOOK_WARM_UP [1]: load every market's book into the web process's cache at
  startup (marketplace/lifespan.py)
- GPUMARKET_BID_BATCH_MAX [128]: the most bids the API's order endpoint places in one
  transaction when bids arrive together (marketplace/api/bid_batcher.py); 1 places
  each alone.
- GPUMARKET_HEARTBEAT_BATCH_MAX [256]: the most runners' heartbeats a web process writes
  in one transaction when they arrive together (marketplace/api/heartbeat_batch.py: one
  thread, holding one database connection of the process's pool); 1 writes each alone.
- GPUMARKET_FAULT_CREDIT_MINUTES [30]: a lease failed by the provider's fault earns the
  buyer the cost of its last N healthy minutes from the provider (docs/FAULTS.md).
- GPUMARKET_FAILOVER_MAX_CONTINUATIONS [3]: a chain fails over at most N times; a
  provider fault past it releases the hold and tells the buyer (docs/FAULTS.md).
- GPUMARKET_HEARTBEAT_TIMEOUT_SECONDS [90]: a node silent this long has its leases failed
  (charged up to its last heartbeat) and its asks withdrawn until it heartbeats again.
- GPUMARKET_IDLE_UTILIZATION_PCT [5]: a running lease whose GPUs all stay under this
  utilisation for GPUMARKET_IDLE_AFTER_SECONDS [900] is shown idle (marketplace/telemetry.py).
- GPUMARKET_TELEMETRY_KEEP_SECONDS [86400]: how long an ended lease's GPU series is kept
  (then the worker deletes it; a running lease keeps its last day).
- GPUMARKET_API_TOKEN_TTL_DAYS [30]: how long an API token is valid (marketplace/api_tokens.py);
  GPUMARKET_API_TOKEN_TOUCH_SECONDS [60]: how stale a token's "last used" may get.
- GPUMARKET_WS_TICKET_SECONDS [30]: how long a websocket ticket (POST /api/v1/ws-tickets/)
  is valid; it is good for one connection.
- Webhooks (docs/WEBHOOKS.md): GPUMARKET_WEBHOOK_ALLOW_PRIVATE [0: a URL whose host
  resolves to a private, loopback or link-local address is refused]; timeouts
  GPUMARKET_WEBHOOK_CONNECT_TIMEOUT_SECONDS [3] and …_READ_TIMEOUT_SECONDS [5]; retries
  after GPUMARKET_WEBHOOK_RETRY_BASE_SECONDS [10] doubling up to …_RETRY_MAX_SECONDS
  [3600], for …_RETRY_WINDOW_SECONDS [86400] after the event; GPUMARKET_WEBHOOK_SWEEP_SECONDS
  [2]: how often the beat queues due retries; GPUMARKET_WEBHOOK_MAX_ENDPOINTS [20] per user;
  GPUMARKET_WEBHOOK_KEEP_DAYS [30]: events (and their log) older than this are deleted.
  Alert rules: GPUMARKET_ALERT_EVALUATE_SECONDS [15]: how often the worker evaluates them;
  GPUMARKET_ALERT_MAX_RULES [50] per user.
- LOG_LEVEL [INFO]: gpumarket's own loggers; DJANGO_LOG_LEVEL [ERROR]: Django's.
- GPUMARKET_VAR_DIR [var/]: local state (SQLite file, secret key, demo logs).
- GPUMARKET_CHAIN_RPC_URL, GPUMARKET_CHAIN_SETTLEMENT_ADDRESS, GPUMARKET_CHAIN_OPERATOR
  [unset: on-chain settlement off]; GPUMARKET_CHAIN_MIRROR_SECONDS [30]: how often
  deposits are credited and settlements mirrored.
- STRIPE_SECRET_KEY, STRIPE_WEBHOOK_SECRET [unset: Stripe off], STRIPE_API_BASE
  [https://api.stripe.com], STRIPE_WEBHOOK_TOLERANCE_SECONDS [300: a signature dated
  further than this from now, past or future, is refused];
  STRIPE_PUBLISHABLE_KEY [unset: no card payment in the wallet page], STRIPE_JS_URL
  [https://js.stripe.com/v3/; loaded only when Stripe is configured].
- GPUMARKET_DB_POOL [1]: with PostgreSQL, a connection pool per process (Django's psycopg
  pool): GPUMARKET_DB_POOL_MIN [1] to GPUMARKET_DB_POOL_MAX [10] connections; a request
  that finds none free within GPUMARKET_DB_POOL_TIMEOUT [5] seconds is a 503 with
  Retry-After, never a 500 (so is PostgreSQL refusing a connection). Each web process,
  Celery worker process (prefork: one at a time per child) and the bid batcher's thread
  draws from its process's pool: keep the sum of every process's maximum under the
  server's max_connections, with room for others. 0: no pool (one connection per request,
  as behind PgBouncer). SQLite (the demo) never pools.
- GPUMARKET_DB_PGBOUNCER [0]: 1 when DATABASE_URL is a PgBouncer in transaction mode
  (docs/SCALING.md): no prepared statements (psycopg's prepare_threshold None), no
  server-side cursors, and GPUMARKET_DB_POOL defaults to 0 (PgBouncer pools).
- Login limits (429 with Retry-After; marketplace/api/throttles.py): GPUMARKET_LOGIN_RATE
  [20/min] attempts per client address at POST /api/v1/auth/token/ and the login page
  together; GPUMARKET_SIGNUP_RATE [10/hour] signups per address (API and page);
  GPUMARKET_LOGIN_LOCKOUT_FAILURES [10] failed logins per username, from any address,
  within a window of GPUMARKET_LOGIN_LOCKOUT_SECONDS [900] lock that username until the
  window ends (never longer). Counters live in the cache: Redis when REDIS_URL is set
  (shared by all processes), else each process's memory. GPUMARKET_NUM_PROXIES [0]:
  reverse proxies in front that append to X-Forwarded-For (0: the client address is the
  connection's peer; uvicorn's --proxy-headers may already have set it).
- Metrics (docs/METRICS.md): GPUMARKET_METRICS_TOKEN [unset] bearer token of GET /metrics;
  GPUMARKET_METRICS_ALLOW [none] networks that may read it without one (neither: 404);
  PROMETHEUS_MULTIPROC_DIR [var/prometheus/]; GPUMARKET_METRICS_HEARTBEAT_LATE_SECONDS
  [30]; GPUMARKET_LEDGER_CHECK_SECONDS [300: how often the worker runs ledger_check; 0 off].
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from pathlib import Path

import environ
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured
from kombu import Queue

from core.settings_env import StrictEnv
from marketplace.template_images import parse_template_images

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(environ.Env().str("GPUMARKET_VAR_DIR", default=str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

env = StrictEnv()  # a number or yes/no that does not parse is refused, naming it

DEBUG = env.bool("DEBUG", default=True)


def _secret_key() -> str:
    if env.str("SECRET_KEY_FILE", default=""):
        return Path(env.str("SECRET_KEY_FILE")).read_text().strip()
    if env.str("SECRET_KEY", default=""):
        return env.str("SECRET_KEY")
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY (or SECRET_KEY_FILE) is required when DEBUG is off")
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()


def _secrets_keys() -> list[str]:
    """GPUMARKET_SECRETS_KEY as a list of Fernet keys (first: the one that seals). With
    DEBUG and none given: one key derived from SECRET_KEY (development, demo and tests
    only: whoever reads SECRET_KEY can open every secret). Never echoes a key."""
    keys = [k.strip() for k in env.str("GPUMARKET_SECRETS_KEY", default="").split(",")
            if k.strip()]
    if not keys:
        if not DEBUG:
            raise ImproperlyConfigured(
                "GPUMARKET_SECRETS_KEY is required when DEBUG is off: one or more Fernet "
                "keys, comma-separated (make one with python -c \"from cryptography.fernet "
                "import Fernet; print(Fernet.generate_key().decode())\")")
        digest = hashlib.sha256(b"gpumarket development secrets key\0" + SECRET_KEY.encode())
        keys = [base64.urlsafe_b64encode(digest.digest()).decode()]
    for i, key in enumerate(keys, 1):
        try:
            Fernet(key)
        except ValueError:
            raise ImproperlyConfigured(
                f"GPUMARKET_SECRETS_KEY: key {i} of {len(keys)} is not a Fernet key (32 "
                "bytes, URL-safe base64)") from None
    return keys


GPUMARKET_SECRETS_KEYS = _secrets_keys()
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "settlement",
    "providers",
    "marketplace",
    "webhooks",
    "alerts",
    "frontend",
]

MIDDLEWARE = [
    "marketplace.logs.RequestIdMiddleware",  # first: every answer carries X-Request-ID
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "frontend.not_found.NotFoundMiddleware",  # a 404 is JSON or a friendly page, DEBUG or not
]

ROOT_URLCONF = "marketplace.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
WSGI_APPLICATION = None
ASGI_APPLICATION = "marketplace.asgi.application"

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'gpumarket.sqlite3'}"),
}
DATABASES["default"].setdefault("ATOMIC_REQUESTS", False)
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # The demo runs web, worker and beat on one SQLite file: wait for the lock
    # instead of failing, and take the write lock at BEGIN.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 30, "transaction_mode": "IMMEDIATE"}
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env.str("REDIS_URL", default="")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # Redis pub/sub: the live feed's hub (frontend/feed/hub.py) subscribes once per
            # group per process and fans out in memory; one PUBLISH per event.
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            # redis-py 8 times a socket out after 5 s, exactly channels_redis' blocking read:
            # an idle websocket would crash (redis/redis-py#4091). Give it room.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 30}]},
        }
    }
else:
    # No server: a layer on a local SQLite file, shared by the web process, the Celery
    # worker and beat of the embedded default (core/sqlite_layer.py).
    CHANNEL_LAYERS = {"default": {
        "BACKEND": "core.sqlite_layer.SQLiteChannelLayer",
        "CONFIG": {"path": str(VAR_DIR / "channels.sqlite3")},
    }}

CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=REDIS_URL or "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    # kombu's transport, each message written whole before a worker can see it
    CELERY_BROKER_TRANSPORT = "core.kombu_filesystem:Transport"
    _queue = VAR_DIR / "celery"
    for sub in ("in", "processed", "control"):
        (_queue / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue / "in"),
        "data_folder_out": str(_queue / "in"),
        "processed_folder": str(_queue / "processed"),
        "store_processed": False,
        "control_folder": str(_queue / "control"),
    }
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
CELERY_BEAT_SCHEDULE = {
    "close-due-auctions": {"task": "marketplace.tasks.close_due_auctions", "schedule": 1.0},
    "end-overdue-leases": {"task": "marketplace.tasks.end_overdue_leases", "schedule": 5.0},
    "expire-orders": {"task": "marketplace.tasks.expire_orders", "schedule": 5.0},
    "preempt-due-leases": {"task": "marketplace.tasks.preempt_due_leases", "schedule": 1.0},
    "maintenance-sweep": {"task": "marketplace.tasks.maintenance_sweep", "schedule": 1.0},
    "meter-running-leases": {"task": "marketplace.tasks.meter_running_leases",
                             "schedule": 60.0},
    "fail-silent-nodes": {"task": "marketplace.tasks.fail_silent_nodes", "schedule": 15.0},
    "drop-ended-telemetry": {"task": "marketplace.tasks.drop_ended_telemetry",
                             "schedule": 300.0},
    # exports gpumarket_ledger_check_ok (docs/METRICS.md); 0: not scheduled
    "ledger-check": {"task": "settlement.tasks.ledger_check",
                     "schedule": float(env.int("GPUMARKET_LEDGER_CHECK_SECONDS", default=300))},
    "resume-failovers": {"task": "marketplace.tasks.resume_failovers", "schedule": 10.0},
    "repair-rematches": {"task": "marketplace.tasks.repair_rematches", "schedule": 30.0},
    "deliver-due-webhooks": {"task": "webhooks.tasks.deliver_due_webhooks",
                             "schedule": env.float("GPUMARKET_WEBHOOK_SWEEP_SECONDS",
                                                   default=2.0)},
    "prune-webhook-events": {"task": "webhooks.tasks.prune_webhook_events",
                             "schedule": 3600.0},
    "evaluate-alert-rules": {"task": "alerts.tasks.evaluate_alert_rules",
                             "schedule": env.float("GPUMARKET_ALERT_EVALUATE_SECONDS",
                                                   default=15.0)},
}
if not CELERY_BEAT_SCHEDULE["ledger-check"]["schedule"]:
    del CELERY_BEAT_SCHEDULE["ledger-check"]
# Webhooks (docs/WEBHOOKS.md; variables in this module's docstring)
GPUMARKET_WEBHOOK_ALLOW_PRIVATE = env.bool("GPUMARKET_WEBHOOK_ALLOW_PRIVATE", default=False)
GPUMARKET_WEBHOOK_CONNECT_TIMEOUT_SECONDS = env.float(
    "GPUMARKET_WEBHOOK_CONNECT_TIMEOUT_SECONDS", default=3.0)
GPUMARKET_WEBHOOK_READ_TIMEOUT_SECONDS = env.float("GPUMARKET_WEBHOOK_READ_TIMEOUT_SECONDS",
                                                   default=5.0)
GPUMARKET_WEBHOOK_RETRY_BASE_SECONDS = env.float("GPUMARKET_WEBHOOK_RETRY_BASE_SECONDS",
                                                 default=10.0)
GPUMARKET_WEBHOOK_RETRY_MAX_SECONDS = env.float("GPUMARKET_WEBHOOK_RETRY_MAX_SECONDS",
                                                default=3600.0)
GPUMARKET_WEBHOOK_RETRY_WINDOW_SECONDS = env.int("GPUMARKET_WEBHOOK_RETRY_WINDOW_SECONDS",
                                                 default=86400)
GPUMARKET_WEBHOOK_MAX_ENDPOINTS = env.int("GPUMARKET_WEBHOOK_MAX_ENDPOINTS", default=20)
GPUMARKET_WEBHOOK_KEEP_DAYS = env.int("GPUMARKET_WEBHOOK_KEEP_DAYS", default=30)
GPUMARKET_ALERT_MAX_RULES = env.int("GPUMARKET_ALERT_MAX_RULES", default=50)
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# the queue of each kind of task (docs/SCALING.md, "Celery"): the market's own (under its
# lock, latency-bound), the leases' sweeps (bulk, hour boundaries), the ledger's
GPUMARKET_CELERY_QUEUE_OF_TASK = {
    "marketplace.tasks.close_auction": "market",
    "marketplace.tasks.close_due_auctions": "market",
    "marketplace.tasks.expire_orders": "market",
    "marketplace.tasks.preempt_due_leases": "market",
    "marketplace.tasks.end_overdue_leases": "leases",
    "marketplace.tasks.repair_rematches": "leases",
    "marketplace.tasks.meter_running_leases": "leases",
    "marketplace.tasks.fail_silent_nodes": "leases",
    "marketplace.tasks.maintenance_sweep": "leases",
    "marketplace.tasks.failover_lease": "leases",
    "marketplace.tasks.resume_failovers": "leases",
    "marketplace.tasks.drop_ended_telemetry": "leases",
    "alerts.tasks.*": "leases",
    "webhooks.tasks.*": "ledger",  # (user notices: off the market's hot path)
    "settlement.tasks.*": "ledger",
}
if env.bool("GPUMARKET_CELERY_QUEUES", default=False):
    CELERY_TASK_ROUTES = {name: {"queue": queue}
                          for name, queue in GPUMARKET_CELERY_QUEUE_OF_TASK.items()}
    # declared, so a worker started without -Q consumes every queue (not only "celery")
    CELERY_TASK_QUEUES = [Queue(name) for name in
                          ("celery", *sorted(set(GPUMARKET_CELERY_QUEUE_OF_TASK.values())))]

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "marketplace.api.auth.ApiTokenAuthentication",
        "marketplace.api.auth.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PARSER_CLASSES": ["marketplace.api.parsers.StrictJSONParser"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "marketplace.api.errors.exception_handler",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 100,
}
# --- Database pool, cache and login limits (issue 10, item 5) ---------------------------
# One block: the pool bounds the connections a process holds (PostgreSQL only; see the
# docstring), the cache holds the login limits' counters, and the throttles use them.
GPUMARKET_DB_PGBOUNCER = env.bool("GPUMARKET_DB_PGBOUNCER", default=False)
GPUMARKET_DB_POOL = env.bool("GPUMARKET_DB_POOL", default=not GPUMARKET_DB_PGBOUNCER)
if GPUMARKET_DB_PGBOUNCER and DATABASES["default"]["ENGINE"].endswith("postgresql"):
    # transaction mode: a transaction may run on any server connection, so nothing may
    # outlive it: no named prepared statements (PgBouncer 1.18, Debian 12, cannot track
    # them) and no WITH HOLD cursors. The market locks are row locks (transaction-scoped).
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = None
GPUMARKET_DB_POOL_MIN = env.int("GPUMARKET_DB_POOL_MIN", default=1)
GPUMARKET_DB_POOL_MAX = env.int("GPUMARKET_DB_POOL_MAX", default=10)
GPUMARKET_DB_POOL_TIMEOUT = env.float("GPUMARKET_DB_POOL_TIMEOUT", default=5.0)
if not 0 <= GPUMARKET_DB_POOL_MIN <= GPUMARKET_DB_POOL_MAX or GPUMARKET_DB_POOL_MAX < 1:
    raise ImproperlyConfigured("GPUMARKET_DB_POOL_MIN and _MAX: need 0 <= MIN <= MAX, MAX >= 1")
if GPUMARKET_DB_POOL_TIMEOUT <= 0:
    raise ImproperlyConfigured("GPUMARKET_DB_POOL_TIMEOUT must be a positive number of seconds")
if GPUMARKET_DB_POOL and DATABASES["default"]["ENGINE"].endswith("postgresql"):
    if DATABASES["default"].get("CONN_MAX_AGE"):
        raise ImproperlyConfigured("the database pool needs CONN_MAX_AGE 0 (no ?conn_max_age= "
                                   "in DATABASE_URL), or GPUMARKET_DB_POOL=0")
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # a pooled connection is checked before it is handed out (PostgreSQL restarted, …)
    DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": GPUMARKET_DB_POOL_MIN, "max_size": GPUMARKET_DB_POOL_MAX,
        "timeout": GPUMARKET_DB_POOL_TIMEOUT, "name": "gpumarket",
    }
# Passwords are hashed with no database connection held (marketplace/auth_backends.py).
AUTHENTICATION_BACKENDS = ["marketplace.auth_backends.ModelBackend"]
# Database unavailable (pool exhausted, PostgreSQL refusing): 503 with Retry-After.
MIDDLEWARE.append("marketplace.db_unavailable.DatabaseUnavailableMiddleware")

if REDIS_URL:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                          "LOCATION": REDIS_URL, "KEY_PREFIX": "gpumarket"}}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
GPUMARKET_LOGIN_RATE = env.str("GPUMARKET_LOGIN_RATE", default="20/min")
GPUMARKET_SIGNUP_RATE = env.str("GPUMARKET_SIGNUP_RATE", default="10/hour")
GPUMARKET_LOGIN_LOCKOUT_FAILURES = env.int("GPUMARKET_LOGIN_LOCKOUT_FAILURES", default=10)
GPUMARKET_LOGIN_LOCKOUT_SECONDS = env.int("GPUMARKET_LOGIN_LOCKOUT_SECONDS", default=900)
if GPUMARKET_LOGIN_LOCKOUT_FAILURES < 1 or GPUMARKET_LOGIN_LOCKOUT_SECONDS < 1:
    raise ImproperlyConfigured("GPUMARKET_LOGIN_LOCKOUT_FAILURES and _SECONDS must be >= 1")
for _name in ("GPUMARKET_LOGIN_RATE", "GPUMARKET_SIGNUP_RATE"):
    if not re.fullmatch(r"[1-9][0-9]*/(s|sec|second|m|min|minute|h|hour|d|day)",
                        globals()[_name]):
        raise ImproperlyConfigured(f"{_name} must look like 20/min (a count per s, min, "
                                   f"hour or day), not {globals()[_name]!r}")
REST_FRAMEWORK["NUM_PROXIES"] = env.int("GPUMARKET_NUM_PROXIES", default=0)
REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] = {"login": GPUMARKET_LOGIN_RATE,
                                            "signup": GPUMARKET_SIGNUP_RATE}
# --- end of the database pool, cache and login limits block -----------------------------

SPECTACULAR_SETTINGS = {
    "TITLE": "gpumarket API",
    "DESCRIPTION": "Sealed-bid and continuous auctions for GPU time. Prices are decimal "
    "USD strings per GPU-hour with at most 6 places; amounts are decimal USD strings.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI from the installed drf-spectacular-sidecar: no CDN, works offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# Django's standard validators, used by the signup API and page (and createsuperuser).
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
     "OPTIONS": {"min_length": 10}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "/admin/login/"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)  # WhiteNoise warns about a missing root otherwise
# WhiteNoise serves static files from the ASGI app itself; with DEBUG it finds them in the
# apps (no collectstatic needed for the demo), in production run `manage.py collectstatic`.
WHITENOISE_USE_FINDERS = DEBUG
WHITENOISE_AUTOREFRESH = DEBUG

# Logs go to stderr. Every line names its request (`[<request id>]`, "-" outside one:
# marketplace/logs.py); Django's errors (an unexpected exception's traceback, under
# django.request) at ERROR, so a 500 is logged with DEBUG off too. uvicorn's own log
# lines get credentials in URLs redacted (marketplace/logs.py, installed at startup).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "marketplace.logs.RequestIdFilter"}},
    "formatters": {"plain": {
        "format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain",
                             "filters": ["request_id"]}},
    "loggers": {
        "gpumarket": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
        "django": {"handlers": ["console"], "propagate": False,
                   "level": env.str("DJANGO_LOG_LEVEL", default="ERROR")},
    },
}

# gpumarket's own settings
GPUMARKET_TAKE_RATE_BPS = env.int("GPUMARKET_TAKE_RATE_BPS", default=1500)
if not 0 <= GPUMARKET_TAKE_RATE_BPS <= 10_000:
    raise ImproperlyConfigured("GPUMARKET_TAKE_RATE_BPS must be between 0 and 10000")
GPUMARKET_DEV_CREDIT = env.bool("GPUMARKET_DEV_CREDIT", default=False)
if GPUMARKET_DEV_CREDIT and not DEBUG:
    raise ImproperlyConfigured("GPUMARKET_DEV_CREDIT must stay off when DEBUG is off")
GPUMARKET_DEFAULT_IMAGE = env.str("GPUMARKET_DEFAULT_IMAGE", default="gpumarket/busybox:local")
GPUMARKET_LEASE_GRACE_SECONDS = env.int("GPUMARKET_LEASE_GRACE_SECONDS", default=30)
GPUMARKET_METER_INTERVAL_SECONDS = env.int("GPUMARKET_METER_INTERVAL_SECONDS", default=3600)
_batch = env.str("GPUMARKET_LEASE_END_BATCH", default="200").strip()
if not re.fullmatch(r"[0-9]+", _batch) or int(_batch) < 1:
    raise ImproperlyConfigured(f"GPUMARKET_LEASE_END_BATCH must be an integer >= 1, "
                               f"not {_batch!r}")
GPUMARKET_LEASE_END_BATCH = int(_batch)
GPUMARKET_REMATCH_REPAIR_SECONDS = env.int("GPUMARKET_REMATCH_REPAIR_SECONDS", default=60)
GPUMARKET_PREEMPTION_NOTICE_SECONDS = env.int("GPUMARKET_PREEMPTION_NOTICE_SECONDS",
                                              default=120)
if GPUMARKET_PREEMPTION_NOTICE_SECONDS < 0:
    raise ImproperlyConfigured("GPUMARKET_PREEMPTION_NOTICE_SECONDS must not be negative")
GPUMARKET_MARKET_LOCK_TIMEOUT_MS = env.int("GPUMARKET_MARKET_LOCK_TIMEOUT_MS", default=5000)
if GPUMARKET_MARKET_LOCK_TIMEOUT_MS < 0:
    raise ImproperlyConfigured("GPUMARKET_MARKET_LOCK_TIMEOUT_MS must not be negative")
GPUMARKET_HEARTBEAT_TIMEOUT_SECONDS = env.int("GPUMARKET_HEARTBEAT_TIMEOUT_SECONDS", default=90)
GPUMARKET_FAULT_CREDIT_MINUTES = env.int("GPUMARKET_FAULT_CREDIT_MINUTES", default=30)
GPUMARKET_FAILOVER_MAX_CONTINUATIONS = env.int("GPUMARKET_FAILOVER_MAX_CONTINUATIONS",
                                               default=3)
if GPUMARKET_FAILOVER_MAX_CONTINUATIONS < 0:
    raise ImproperlyConfigured("GPUMARKET_FAILOVER_MAX_CONTINUATIONS must not be negative")
GPUMARKET_IDLE_UTILIZATION_PCT = env.int("GPUMARKET_IDLE_UTILIZATION_PCT", default=5)
GPUMARKET_IDLE_AFTER_SECONDS = env.int("GPUMARKET_IDLE_AFTER_SECONDS", default=900)
GPUMARKET_TELEMETRY_KEEP_SECONDS = env.int("GPUMARKET_TELEMETRY_KEEP_SECONDS", default=86400)
if not 0 <= GPUMARKET_IDLE_UTILIZATION_PCT <= 100 or GPUMARKET_IDLE_AFTER_SECONDS < 1:
    raise ImproperlyConfigured("GPUMARKET_IDLE_UTILIZATION_PCT must be 0-100 and "
                               "GPUMARKET_IDLE_AFTER_SECONDS at least 1")
GPUMARKET_API_TOKEN_TTL_DAYS = env.int("GPUMARKET_API_TOKEN_TTL_DAYS", default=30)
if GPUMARKET_API_TOKEN_TTL_DAYS < 1:
    raise ImproperlyConfigured("GPUMARKET_API_TOKEN_TTL_DAYS must be at least 1")
GPUMARKET_API_TOKEN_TOUCH_SECONDS = env.int("GPUMARKET_API_TOKEN_TOUCH_SECONDS", default=60)
GPUMARKET_WS_TICKET_SECONDS = env.int("GPUMARKET_WS_TICKET_SECONDS", default=30)
if not 1 <= GPUMARKET_WS_TICKET_SECONDS <= 300:
    raise ImproperlyConfigured("GPUMARKET_WS_TICKET_SECONDS must be between 1 and 300")
GPUMARKET_BOOK_WARM_UP = env.bool("GPUMARKET_BOOK_WARM_UP", default=True)
GPUMARKET_BID_QUEUE = env.str("GPUMARKET_BID_QUEUE", default="redis" if REDIS_URL else "process")
if GPUMARKET_BID_QUEUE not in ("redis", "process"):
    raise ImproperlyConfigured("GPUMARKET_BID_QUEUE must be redis or process")
if GPUMARKET_BID_QUEUE == "redis" and not REDIS_URL:
    raise ImproperlyConfigured("GPUMARKET_BID_QUEUE=redis needs REDIS_URL")
GPUMARKET_BID_QUEUE_LEASE_MS = env.int("GPUMARKET_BID_QUEUE_LEASE_MS", default=5000)
GPUMARKET_BID_QUEUE_TIMEOUT_SECONDS = env.int("GPUMARKET_BID_QUEUE_TIMEOUT_SECONDS", default=30)
GPUMARKET_BID_BATCH_MAX = env.int("GPUMARKET_BID_BATCH_MAX", default=128)
GPUMARKET_HEARTBEAT_BATCH_MAX = env.int("GPUMARKET_HEARTBEAT_BATCH_MAX", default=256)
if GPUMARKET_HEARTBEAT_BATCH_MAX < 1:
    raise ImproperlyConfigured("GPUMARKET_HEARTBEAT_BATCH_MAX must be at least 1")
if GPUMARKET_BID_BATCH_MAX < 1:
    raise ImproperlyConfigured("GPUMARKET_BID_BATCH_MAX must be at least 1")
# A bid's checkpoint endpoint_url may be a private or loopback address (tests, an
# operator's own store): off by default, so the bid-time probe is no SSRF probe
# (marketplace/checkpoints.py)
GPUMARKET_CHECKPOINT_ALLOW_PRIVATE = env.bool("GPUMARKET_CHECKPOINT_ALLOW_PRIVATE",
                                              default=False)
# An image may name a registry at localhost or a private/loopback IP literal (tests and
# demos with a registry on 127.0.0.1): off by default, so no bid makes providers' engines
# (and, through pre-pulls, every node) connect into their own networks (docs/IMAGES.md)
GPUMARKET_IMAGE_ALLOW_PRIVATE_REGISTRY = env.bool("GPUMARKET_IMAGE_ALLOW_PRIVATE_REGISTRY",
                                                  default=False)
try:  # an operator's image per template: a registry mirror, or a local image
    GPUMARKET_TEMPLATE_IMAGES = parse_template_images(
        env.str("GPUMARKET_TEMPLATE_IMAGES", default=""),
        allow_private_registry=GPUMARKET_IMAGE_ALLOW_PRIVATE_REGISTRY)
except ValueError as _exc:
    raise ImproperlyConfigured(f"GPUMARKET_TEMPLATE_IMAGES: {_exc}") from None

# Stripe (off unless STRIPE_SECRET_KEY is set). STRIPE_API_BASE points the official
# library elsewhere (tests: localstripe on 127.0.0.1).
STRIPE_SECRET_KEY = env.str("STRIPE_SECRET_KEY", default="")
STRIPE_WEBHOOK_SECRET = env.str("STRIPE_WEBHOOK_SECRET", default="")
STRIPE_API_BASE = env.str("STRIPE_API_BASE", default="https://api.stripe.com")
STRIPE_WEBHOOK_TOLERANCE_SECONDS = env.int("STRIPE_WEBHOOK_TOLERANCE_SECONDS", default=300)
if STRIPE_WEBHOOK_TOLERANCE_SECONDS < 1:  # the stripe library reads 0 as "no limit"
    raise ImproperlyConfigured("STRIPE_WEBHOOK_TOLERANCE_SECONDS must be at least 1")
# Stripe.js in the wallet page (frontend/stripe_views.py); tests: localstripe's mock
STRIPE_PUBLISHABLE_KEY = env.str("STRIPE_PUBLISHABLE_KEY", default="")
STRIPE_JS_URL = env.str("STRIPE_JS_URL", default="https://js.stripe.com/v3/")

# On-chain settlement (off unless GPUMARKET_CHAIN_RPC_URL is set): the JSON-RPC node, the
# deployed Settlement contract, and the operator account the node signs for.
GPUMARKET_CHAIN_RPC_URL = env.str("GPUMARKET_CHAIN_RPC_URL", default="")
GPUMARKET_CHAIN_SETTLEMENT_ADDRESS = env.str("GPUMARKET_CHAIN_SETTLEMENT_ADDRESS", default="")
GPUMARKET_CHAIN_OPERATOR = env.str("GPUMARKET_CHAIN_OPERATOR", default="")
GPUMARKET_CHAIN_MIRROR_SECONDS = env.int("GPUMARKET_CHAIN_MIRROR_SECONDS", default=30)
if GPUMARKET_CHAIN_RPC_URL:
    CELERY_BEAT_SCHEDULE["mirror-on-chain"] = {"task": "settlement.tasks.mirror_on_chain",
                                               "schedule": GPUMARKET_CHAIN_MIRROR_SECONDS}

# === HTTP security and request limits (issue 10) =======================================
# With DEBUG=0 the defaults are the safe ones (`manage.py check --deploy` prints no
# warning): HTTPS only (plain http is redirected), Secure session and CSRF cookies, HSTS
# for a year with subdomains and preload, and a Content-Security-Policy on the pages
# (frontend/csp.py). Behind a proxy that terminates TLS and talks plain http to uvicorn:
# run uvicorn with `--proxy-headers --forwarded-allow-ips=<the proxy>` (the request is then
# https to Django), or set GPUMARKET_SECURE_PROXY_SSL_HEADER=X-Forwarded-Proto when the
# proxy always sets that header itself; GPUMARKET_SSL_REDIRECT=0 turns the redirect off
# (the proxy redirects, or a local server without TLS, as the benchmarks run).
# - GPUMARKET_SSL_REDIRECT [on when DEBUG is off]
# - GPUMARKET_SECURE_PROXY_SSL_HEADER [unset]: a header name; its value "https" marks a
#   request as secure (SECURE_PROXY_SSL_HEADER)
# - GPUMARKET_SECURE_COOKIES [on when DEBUG is off]: Secure session and CSRF cookies
# - GPUMARKET_HSTS_SECONDS [31536000 when DEBUG is off, else 0],
#   GPUMARKET_HSTS_INCLUDE_SUBDOMAINS [1], GPUMARKET_HSTS_PRELOAD [1]
# - GPUMARKET_MAX_REQUEST_BYTES [2097152]: the largest request body (DATA_UPLOAD_MAX_MEMORY_SIZE;
#   the API's JSON parser refuses a larger one with a 400)
SECURE_SSL_REDIRECT = env.bool("GPUMARKET_SSL_REDIRECT", default=not DEBUG)
_proxy_header = env.str("GPUMARKET_SECURE_PROXY_SSL_HEADER", default="")
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_" + _proxy_header.upper().replace("-", "_"), "https") if _proxy_header else None)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env.bool("GPUMARKET_SECURE_COOKIES",
                                                      default=not DEBUG)
SECURE_HSTS_SECONDS = env.int("GPUMARKET_HSTS_SECONDS", default=0 if DEBUG else 31_536_000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("GPUMARKET_HSTS_INCLUDE_SUBDOMAINS", default=True)
SECURE_HSTS_PRELOAD = env.bool("GPUMARKET_HSTS_PRELOAD", default=True)
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("GPUMARKET_MAX_REQUEST_BYTES", default=2 * 1024 * 1024)
MIDDLEWARE.append("frontend.csp.ContentSecurityPolicyMiddleware")
# === end of HTTP security and request limits ============================================

# --- Metrics (issue 16; docs/METRICS.md) ------------------------------------------------
# /metrics is off (404) unless GPUMARKET_METRICS_TOKEN (a bearer token; only its SHA-256 is
# kept) or GPUMARKET_METRICS_ALLOW (comma-separated networks, e.g. 127.0.0.1/32,10.0.0.0/8:
# the connection's peer address, never X-Forwarded-For) is set. Every process of one
# deployment writes its metrics under PROMETHEUS_MULTIPROC_DIR [var/prometheus/] (wipe it
# when the whole deployment restarts; a dead process's live gauges go at the next scrape).
# A heartbeat later than GPUMARKET_METRICS_HEARTBEAT_LATE_SECONDS [30: three of the
# runner's default intervals] after the node's previous one counts as late.
GPUMARKET_METRICS_TOKEN_SHA256 = hashlib.sha256(
    env.str("GPUMARKET_METRICS_TOKEN", default="").encode()).hexdigest() if env.str(
    "GPUMARKET_METRICS_TOKEN", default="") else ""
try:
    import ipaddress as _ipaddress
    GPUMARKET_METRICS_ALLOW = [_ipaddress.ip_network(n.strip(), strict=False) for n in
                               env.str("GPUMARKET_METRICS_ALLOW", default="").split(",")
                               if n.strip()]
except ValueError as _exc:
    raise ImproperlyConfigured(f"GPUMARKET_METRICS_ALLOW: {_exc}") from None
GPUMARKET_METRICS_HEARTBEAT_LATE_SECONDS = env.int("GPUMARKET_METRICS_HEARTBEAT_LATE_SECONDS",
                                                   default=30)
# (PROMETHEUS_MULTIPROC_DIR is set by core/metrics.py, imported before these settings.)
