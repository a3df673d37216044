"""API keys: issue, hash, resolve to a principal, check scopes.

A key is `cmk_` + 43 random url-safe characters; only its sha256 is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import secrets
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

import asyncpg

from api_service.core.errors import Forbidden, InvalidInput, Unauthorized
from api_service.core.ids import new_id
from api_service.limits import PlanLimits
from api_service.store import admin
from api_service.store.db import Conn
from api_service.store.records import ApiKey

log = logging.getLogger(__name__)

Scope = Literal["read", "write"]
SCOPES: tuple[Scope, ...] = ("read", "write")
KEY_PREFIX = "cmk_"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the key's organization and scopes."""

    org_id: str
    key_id: str
    scopes: frozenset[str]
    redact_pii: bool = False
    plan: PlanLimits = field(default_factory=PlanLimits)

    def require(self, scope: Scope) -> None:
        if scope not in self.scopes:
            raise Forbidden(f"Forbidden: missing scope {scope}")


def rest_scope(method: str) -> Scope:
    """The scope a REST request needs: GET and HEAD read, every other method writes."""
    return "read" if method in ("GET", "HEAD") else "write"


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def parse_scopes(text: str) -> list[str]:
    scopes = sorted({s.strip() for s in text.split(",") if s.strip()})
    unknown = [s for s in scopes if s not in SCOPES]
    if not scopes or unknown:
        raise InvalidInput(f"scopes must be a comma-separated subset of {', '.join(SCOPES)}")
    return scopes


def new_secret() -> str:
    """A new key's secret: KEY_PREFIX and 43 random url-safe characters."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


async def issue_key(
    conn: Conn, org_id: str, scopes: list[str], expires_in_days: float | None
) -> tuple[str, ApiKey]:
    """Create a key; return the secret (shown once, never stored) and its record."""
    secret = new_secret()
    expires_at = (
        None if expires_in_days is None else datetime.now(UTC) + timedelta(days=expires_in_days)
    )
    record = await admin.insert_key(
        conn,
        org_id=org_id,
        key_id=new_id("key"),
        key_hash=hash_key(secret),
        prefix=secret[:10],
        scopes=scopes,
        expires_at=expires_at,
    )
    return secret, record


def bearer_token(authorization: str | None) -> str:
    """The token of an `Authorization: Bearer <token>` header, or Unauthorized."""
    if not authorization:
        raise Unauthorized("Unauthorized: missing API key (send 'Authorization: Bearer <key>')")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Unauthorized: expected 'Authorization: Bearer <key>'")
    return token.strip()


class KeyCache:
    """Keys this process resolved, by digest, so a request needs no lookup of its own.

    Entries are kept only while a connection listens on AUTH_CHANNEL, where PostgreSQL
    announces every change that can alter what a key resolves to (migration 0005): the
    announcement empties the cache, so a revoked key stops working as soon as it arrives.
    Without that connection (not started, or lost until it reconnects) nothing is kept. An
    entry lives at most `ttl_seconds` besides, should an announcement be lost. Unknown keys
    are never kept: guessing cannot fill the cache."""

    AUTH_CHANNEL = "memory_auth_changed"
    RECONNECT_SECONDS = 1.0

    def __init__(
        self,
        max_entries: int = 10_000,
        ttl_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max = max_entries
        self._ttl = ttl_seconds
        self._clock = clock
        self._entries: dict[bytes, tuple[float, admin.KeyMatch]] = {}
        self._generation = 0  # moves on at every emptying
        self.listening = False

    @property
    def generation(self) -> int:
        return self._generation

    def get(self, digest: bytes) -> admin.KeyMatch | None:
        entry = self._entries.get(digest)
        if entry is None or not self.listening:
            return None
        kept_at, match = entry
        if self._clock() - kept_at > self._ttl:
            del self._entries[digest]
            return None
        return match

    def put(self, digest: bytes, match: admin.KeyMatch, generation: int) -> None:
        """Keep `match`, read from PostgreSQL when the cache was at `generation`; not if the
        cache has been emptied since, as the read may predate the change announced."""
        if not self.listening or generation != self._generation or self._max <= 0:
            return
        if len(self._entries) >= self._max:
            self._entries.clear()  # rare: more live keys than entries; start over
        self._entries[digest] = (self._clock(), match)

    def clear(self) -> None:
        self._entries.clear()
        self._generation += 1

    async def listen(self, database_url: str) -> None:
        """Keep a connection listening for changes until cancelled, reconnecting when lost."""
        failing = False  # warned of this outage already
        while True:
            try:
                conn = await asyncpg.connect(database_url)
            except (OSError, asyncpg.PostgresError) as exc:
                if not failing:
                    log.warning("key cache: cannot listen (%s); keys are looked up each time", exc)
                failing = True
                await asyncio.sleep(self.RECONNECT_SECONDS)
                continue
            failing = False
            try:
                await self._listen_on(conn)
                log.warning("key cache: the listening connection was lost; reconnecting")
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                log.warning("key cache: listening failed (%s); reconnecting", exc)
            finally:
                self.listening = False
                self.clear()
                with contextlib.suppress(Exception):
                    await conn.close(timeout=2)
            await asyncio.sleep(self.RECONNECT_SECONDS)

    async def _listen_on(self, conn: asyncpg.Connection) -> None:
        """Keep entries while `conn` listens; return when it is lost."""
        lost = asyncio.Event()
        conn.add_termination_listener(lambda _: lost.set())
        await conn.add_listener(self.AUTH_CHANNEL, lambda *_: self.clear())
        self.clear()  # what was read before listening may have changed unannounced
        self.listening = True
        await lost.wait()


async def resolve(
    pool: Conn | asyncpg.Pool,
    digest: bytes,
    default_plan: PlanLimits | None = None,
    now: datetime | None = None,
    cache: KeyCache | None = None,
    lookup: bool = True,
) -> Principal:
    """The principal for the key of `digest` (hash_key of the bearer token); 401 for an unknown
    key, 403 for an expired or revoked one. The org's plan, or `default_plan`, comes in the
    same query, or from `cache`; with `lookup` False only from `cache` (a key it does not hold
    gets 401)."""
    found = cache.get(digest) if cache is not None else None
    if found is None and lookup:
        generation = cache.generation if cache is not None else 0
        found = await admin.key_by_hash(pool, digest)
        if found is not None and cache is not None:
            cache.put(digest, found, generation)
    if found is None or not hmac.compare_digest(found.key_hash, digest):
        raise Unauthorized("Unauthorized: invalid API key")
    key = found.key
    if key.revoked_at is not None:
        raise Forbidden("Forbidden: API key revoked")
    if key.expires_at is not None and key.expires_at <= (now or datetime.now(UTC)):
        raise Forbidden("Forbidden: API key expired")
    plan = found.plan or default_plan or PlanLimits()
    return Principal(
        org_id=key.org_id,
        key_id=key.key_id,
        scopes=frozenset(key.scopes),
        redact_pii=found.redact_pii,
        plan=plan,
    )


class FailedAuthThrottle:
    """Slows key guessing: a client (IP address) with `max_failures` unknown keys within
    `window_seconds` has only known keys looked up until the oldest failure leaves the
    window; the middleware answers the others 401 with Retry-After. A key is known once it
    has authenticated (the last `max_known` of them, by digest): a client guessing keys
    behind a shared address does not lock out those already using theirs. Unknown keys being
    looked up count toward the limit too, so that concurrent guesses cannot all pass the check
    before the first of them has failed: where they alone reach it, the next unknown key waits
    for one of their lookups to end (they may be valid keys, a gateway's clients, say), and a
    request whose key is already being looked up goes ahead."""

    def __init__(
        self,
        max_failures: int = 20,
        window_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        max_known: int = 100_000,
    ) -> None:
        self._max = max_failures
        self._window = window_seconds
        self._clock = clock
        self._failures: dict[str, deque[float]] = {}
        # Lookups of unknown keys under way: client -> digest -> requests waiting on it.
        self._pending: dict[str, Counter[bytes]] = {}
        self._lookup_ended = asyncio.Event()  # set, then replaced, as each lookup ends
        self._known: OrderedDict[bytes, None] = OrderedDict()
        self._max_known = max_known

    def knows(self, digest: bytes) -> bool:
        """Whether the key of `digest` has authenticated lately."""
        return digest in self._known

    def vouch(self, digest: bytes) -> None:
        """Remember that the key of `digest` authenticated."""
        self._known[digest] = None
        self._known.move_to_end(digest)
        if len(self._known) > self._max_known:
            self._known.popitem(last=False)

    def retry_after(self, client: str) -> float:
        """Seconds until `client`'s failures let it try again; 0 when they do now."""
        failures = self._recent_failures(client)
        if len(failures) < self._max:
            return 0.0
        return failures[0] + self._window - self._clock()

    async def turn(self, client: str, digest: bytes) -> float:
        """Seconds `client` must wait before its unknown key of `digest` may be looked up; 0:
        now. While lookups under way alone make up the limit, waits for one to end."""
        while True:
            wait = self.retry_after(client)
            if wait > 0:
                return wait
            pending = self._pending.get(client, Counter[bytes]())
            if digest in pending or len(self._failures.get(client, ())) + len(pending) < self._max:
                return 0.0
            await self._lookup_ended.wait()

    def _recent_failures(self, client: str) -> deque[float]:
        failures = self._failures.get(client, deque())
        horizon = self._clock() - self._window
        while failures and failures[0] <= horizon:
            failures.popleft()
        if not failures:
            self._failures.pop(client, None)
        return failures

    @contextlib.contextmanager
    def looking_up(self, client: str, digest: bytes) -> Iterator[None]:
        """Count the unknown key of `digest` from `client` as a failure while it is looked up."""
        pending = self._pending.setdefault(client, Counter())
        pending[digest] += 1
        try:
            yield
        finally:
            pending[digest] -= 1
            if not pending[digest]:
                del pending[digest]
            if not pending:
                self._pending.pop(client, None)
            self._lookup_ended.set()
            self._lookup_ended = asyncio.Event()

    def failed(self, client: str) -> None:
        self._failures.setdefault(client, deque()).append(self._clock())
        if len(self._failures) > 100_000:  # bound memory under a spray of addresses
            self._failures.pop(next(iter(self._failures)))
