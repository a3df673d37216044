"""Chunk windows: WINDOW messages, stride STRIDE; window k covers [1 + 3k, 5 + 3k]."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

WINDOW = 5
STRIDE = 3


def window_starts_touching(first: int, last: int, count: int) -> list[int]:
    """Start sequences of the windows that contain any sequence in [first, last].

    `count` is the conversation's message count; windows start only at sequences <= count.
    """
    if first > last:
        return []
    lowest_k = max(0, -(-(first - WINDOW) // STRIDE))  # ceil((first - WINDOW) / STRIDE)
    highest_k = (min(last, count) - 1) // STRIDE
    return [1 + STRIDE * k for k in range(lowest_k, highest_k + 1)]


def window_end(start: int, count: int) -> int:
    """Last sequence of the window starting at `start` in a conversation of `count` messages."""
    return min(start + WINDOW - 1, count)


# The model reads a window's first 384 tokens, which text reaches within a few thousand
# characters. A window holds up to five messages of 100,000 characters, and redaction markers
# can make them several times longer: past what embed_service takes in one text
# (EMBED_MAX_TEXT_CHARS, 1,000,000), which would refuse the window on every retry.
EMBEDDED_CHARS = 200_000


def embedded_text(text: str) -> str:
    """The part of a window's text that is sent to be embedded."""
    return text[:EMBEDDED_CHARS]


def chunk_text(lines: Iterable[tuple[str, str]]) -> str:
    """One line per message, `[role]: content`."""
    return "\n".join(f"[{role}]: {content}" for role, content in lines)


def window_texts(lines: Sequence[tuple[str, str]]) -> list[str]:
    """The text of every window of a conversation whose messages, in order, have `lines`
    (role, content): window i starts at sequence 1 + STRIDE * i."""
    count = len(lines)
    return [
        chunk_text(lines[start - 1 : window_end(start, count)])
        for start in range(1, count + 1, STRIDE)
    ]


TRUNCATION_SUFFIX = "...[truncated]"


def clip(text: str, max_chars: int) -> str:
    """Clip to at most `max_chars` characters, the suffix included, marking the cut."""
    if len(text) <= max_chars:
        return text
    return text[: max_chars - len(TRUNCATION_SUFFIX)] + TRUNCATION_SUFFIX
