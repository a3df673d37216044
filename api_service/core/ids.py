"""Opaque, prefixed identifiers."""

from __future__ import annotations

import hashlib
import secrets


def new_id(prefix: str) -> str:
    """`prefix_` followed by 16 random url-safe characters (96 bits)."""
    return f"{prefix}_{secrets.token_urlsafe(12)}"


def chunk_id(conversation_id: str, start_sequence: int) -> str:
    """Stable per (conversation, window start), so a rebuilt window replaces, never duplicates."""
    digest = hashlib.blake2b(f"{conversation_id}:{start_sequence}".encode(), digest_size=12)
    return f"chk_{digest.hexdigest()}"
