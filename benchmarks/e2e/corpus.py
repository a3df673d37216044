"""The e2e benchmark's corpus: LongMemEval s150 conversations, repeated as far as a size needs,
each pass over them after the first respelt."""

from __future__ import annotations

import gzip
import itertools
import json
from collections.abc import Iterator
from pathlib import Path

# Each pass over the corpus after the first respells two lower-case letters as Greek ones, a
# pair and a spelling of its own, so that about a fifth of the words differ between any two
# passes: a repeated conversation is a related text, as in a real org, not the same one. Exact
# copies gave each chunk 40 identical vectors at 1M; recall@10 then measured only whether one
# list was probed, and the index's calibration queries became far easier than questions
# (docs/performance.md, "Recall at 1M").
RESPELT_PAIRS = list(itertools.combinations("bcdfgmpwy", 2))
GREEK = "αβγδεζηθικλμνξοπρστυφχψω"


def respelt(text: str, pass_no: int) -> str:
    """`text` as pass `pass_no` over the corpus spells it (the first pass: as written)."""
    if pass_no == 0:
        return text
    first, second = RESPELT_PAIRS[(pass_no - 1) % len(RESPELT_PAIRS)]
    spelling = GREEK[pass_no % len(GREEK)], GREEK[(pass_no + 12) % len(GREEK)]
    return text.replace(first, spelling[0]).replace(second, spelling[1])


def conversations(data: Path, respell: bool = True) -> Iterator[list[dict[str, str]]]:
    """LongMemEval s150 conversations' messages, over and over, respelt in each pass (with
    `respell`; else exact copies)."""
    return (messages for _, messages in keyed_conversations(data, respell))


def keyed_conversations(
    data: Path, respell: bool = True
) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """As `conversations`, each with its LongMemEval `conversation_key` (the questions name
    their conversation by it)."""
    with gzip.open(data / "s150.conversations.jsonl.gz", "rt") as f:
        convs = [json.loads(line) for line in f]
    for pass_no in itertools.count():
        spelling = pass_no if respell else 0
        for conv in convs:
            messages = [
                {"role": m["role"], "content": respelt(m["content"], spelling)}
                for m in conv["messages"]
            ]
            yield conv["conversation_key"], messages
