"""Checks of caller input against the configured size limits; each error names its parameter."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from api_service.core.errors import InvalidInput
from api_service.settings import Limits
from api_service.store.records import NewMessage

ROLES = ("user", "assistant", "system", "tool")
_TAG = re.compile(r"[A-Za-z0-9_.:-]+")
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
METADATA_MAX_DEPTH = 32
# JSON's escape of a NUL: `\u0000` whose backslash is not itself escaped, so after an even run
# of backslashes. After an odd run it is the text `\u0000`, six characters and no NUL.
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def is_id(value: str) -> bool:
    """Whether `value` has the shape of an id this service issues (`conv_...`, `msg_...`)."""
    return bool(_ID.fullmatch(value))


def text(name: str, value: str | None, max_chars: int, *, required: bool = False) -> str | None:
    """A string of at most `max_chars`, without NUL characters (PostgreSQL cannot store them)."""
    if value is None:
        if required:
            raise InvalidInput(f"{name} is required")
        return None
    if len(value) > max_chars:
        raise InvalidInput(f"{name} is longer than {max_chars} characters")
    if "\x00" in value:
        raise InvalidInput(f"{name} must not contain NUL (\\u0000) characters")
    _require_unicode(name, value)
    return value


def _require_unicode(name: str, value: str) -> None:
    """Refuse lone surrogates (JSON can carry them, UTF-8 cannot store them)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(
            f"{name} must be valid Unicode text (it holds a lone surrogate such as \\ud800)"
        ) from None


def tags(name: str, values: Sequence[str] | None, limits: Limits) -> list[str]:
    if not values:
        return []
    if len(values) > limits.tags:
        raise InvalidInput(f"{name} holds more than {limits.tags} tags")
    for tag in values:
        if len(tag) > limits.tag_chars or not _TAG.fullmatch(tag):
            raise InvalidInput(
                f"{name}: each tag is 1 to {limits.tag_chars} characters of A-Z a-z 0-9 _ . : -"
            )
    return list(dict.fromkeys(values))  # drop repeats, keep order


def metadata(name: str, value: dict[str, Any] | None, limits: Limits) -> dict[str, Any] | None:
    if value is None:
        return None
    depth, finite = _shape(value)
    if depth > METADATA_MAX_DEPTH:
        raise InvalidInput(f"{name} is nested deeper than {METADATA_MAX_DEPTH} levels")
    if not finite:
        raise InvalidInput(f"{name} holds a number JSON cannot store (NaN or infinite)")
    encoded = json_text(value)
    _require_unicode(name, encoded)
    if len(encoded.encode()) > limits.metadata_bytes:
        raise InvalidInput(f"{name} is larger than {limits.metadata_bytes} bytes as JSON")
    if _ESCAPED_NUL.search(encoded):
        raise InvalidInput(f"{name} must not contain NUL (\\u0000) characters")
    return value


def messages(items: Sequence[NewMessage], limits: Limits) -> list[NewMessage]:
    if not items:
        raise InvalidInput("messages must hold at least 1 message")
    if len(items) > limits.messages_per_append:
        raise InvalidInput(f"messages holds more than {limits.messages_per_append} messages")
    for i, m in enumerate(items):
        where = f"messages[{i}]"
        if m.role not in ROLES:
            raise InvalidInput(f"{where}.role must be one of {', '.join(ROLES)}")
        text(f"{where}.content", m.content, limits.content_chars, required=True)
        text(f"{where}.tool_call_id", m.tool_call_id, limits.tool_field_chars)
        text(f"{where}.tool_name", m.tool_name, limits.tool_field_chars)
        metadata(f"{where}.metadata", m.metadata, limits)
    return list(items)


def stored_bytes(*parts: str | dict[str, Any] | None) -> int:
    """Bytes a write adds to storage: UTF-8 text plus metadata as JSON."""
    total = 0
    for part in parts:
        if isinstance(part, str):
            total += len(part.encode())
        elif part is not None:
            total += len(json_text(part).encode())
    return total


def json_text(value: dict[str, Any]) -> str:
    """Metadata as the JSON its size is measured in: compact, as a client would send it."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _shape(value: Any) -> tuple[int, bool]:
    """Nesting depth of a JSON value, and whether all its numbers are finite; no recursion."""
    deepest, finite, stack = 0, True, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if level > METADATA_MAX_DEPTH:
            break
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
        elif isinstance(item, float) and not math.isfinite(item):
            finite = False
    return deepest, finite
