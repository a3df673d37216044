"""API keys: issue, hash, resolve to a principal, check scopes.

A key is `cmk_` + 43 random url-safe characters; only its sha256 is stored.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import deque
from collections.abc import Callable
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


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def parse_scopes(text: str) -> list[str]:
    scopes = sorted({s.strip() for s in text.split(",") if s.strip()})
    unknown = [s for s in scopes if s not in SCOPES]
    if not scopes or unknown:
        raise InvalidInput(f"scopes must be a comma-separated subset of {', '.join(SCOPES)}")
    return scopes


async def issue_key(
    conn: Conn, org_id: str, scopes: list[str], expires_in_days: float | None
) -> tuple[str, ApiKey]:
    """Create a key; return the secret (shown once, never stored) and its record."""
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
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


async def resolve(
    pool: asyncpg.Pool,
    authorization: str | None,
    default_plan: PlanLimits | None = None,
    now: datetime | None = None,
) -> Principal:
    """The principal for an Authorization header; 401 for a missing or unknown key, 403 for an
    expired or revoked one. The org's plan, or `default_plan`, comes in the same query."""
    token = bearer_token(authorization)
    digest = hash_key(token)
    found = await admin.key_by_hash(pool, digest)
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
    """Slows key guessing: a client (IP address) with `max_failures` failed authentications
    within `window_seconds` is refused with 429 until the oldest failure leaves the window,
    without a database lookup."""

    def __init__(
        self,
        max_failures: int = 20,
        window_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max = max_failures
        self._window = window_seconds
        self._clock = clock
        self._failures: dict[str, deque[float]] = {}

    def retry_after(self, client: str) -> float:
        """Seconds until `client` may try again; 0 when it may now."""
        failures = self._failures.get(client)
        if not failures:
            return 0.0
        now = self._clock()
        while failures and failures[0] <= now - self._window:
            failures.popleft()
        if not failures:
            del self._failures[client]
            return 0.0
        if len(failures) < self._max:
            return 0.0
        return failures[0] + self._window - now

    def failed(self, client: str) -> None:
        self._failures.setdefault(client, deque()).append(self._clock())
        if len(self._failures) > 100_000:  # bound memory under a spray of addresses
            self._failures.pop(next(iter(self._failures)))
