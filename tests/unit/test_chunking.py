import pytest

from api_service.core.chunking import (
    TRUNCATION_SUFFIX,
    chunk_text,
    clip,
    window_end,
    window_starts_touching,
    window_texts,
)


@pytest.mark.parametrize(
    ("first", "last", "count", "starts"),
    [
        (1, 1, 1, [1]),
        (1, 5, 5, [1, 4]),
        (1, 7, 7, [1, 4, 7]),
        (6, 6, 6, [4]),  # the new message only touches the tail window
        (8, 10, 10, [4, 7, 10]),  # window 4 covered 4..8 and was incomplete at 7 messages
        (3, 3, 10, [1]),  # an edit of message 3 touches only the first window
        (5, 5, 10, [1, 4]),
    ],
)
def test_windows_touching(first: int, last: int, count: int, starts: list[int]) -> None:
    assert window_starts_touching(first, last, count) == starts


def test_every_sequence_is_covered_and_windows_follow_the_stride() -> None:
    count = 23
    starts = window_starts_touching(1, count, count)
    assert starts == list(range(1, count + 1, 3))
    covered = {s for start in starts for s in range(start, window_end(start, count) + 1)}
    assert covered == set(range(1, count + 1))
    assert window_end(22, count) == 23
    assert window_end(1, count) == 5


def test_chunk_text_and_clip() -> None:
    text = chunk_text([("user", "hi"), ("assistant", "hello")])
    assert text == "[user]: hi\n[assistant]: hello"
    assert clip(text, 100) == text
    clipped = clip("x" * 100, 40)
    assert len(clipped) == 40 and clipped.endswith(TRUNCATION_SUFFIX)


def test_a_whole_conversations_windows_are_those_an_append_writes() -> None:
    """window_texts (the benchmarks' corpus) gives the windows the service writes when one
    append stores the whole conversation."""
    lines = [("user" if s % 2 else "assistant", f"message {s}") for s in range(1, 9)]
    starts = window_starts_touching(1, len(lines), len(lines))
    assert window_texts(lines) == [
        chunk_text(lines[start - 1 : window_end(start, len(lines))]) for start in starts
    ]
    assert window_texts(lines)[-1] == "[user]: message 7\n[assistant]: message 8"
    assert window_texts([]) == []
