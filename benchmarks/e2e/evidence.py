"""Whether a search's best 10 hold the answer to its question.

LongMemEval names, for each question, the messages of its own conversation that answer it. The
e2e org holds that conversation once per pass over the corpus (respelt after the first), so a
chunk holds the answer when it is a window, in any copy of that conversation, over one of those
messages. Recall@10 asks how much of the exact vector ranking a search finds; this asks whether
what it returns answers the question, which is what two hybrid searches that rank differently
(the service's BM25 and pgvector's ts_rank_cd, each fused with vectors) compare on.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from beside import K

from api_service.core.chunking import WINDOW


class Evidence:
    """The chunks that hold each timed question's answer, from the questions' records (in the
    order they were asked), every chunk's (chunk_id, conversation_id, start_sequence) and the
    LongMemEval key of each conversation the corpus wrote. A question asked more than once
    (the timing cycles through them) counts once, at its first ask."""

    def __init__(
        self,
        questions: list[dict[str, Any]],
        windows: Iterable[tuple[str, str, int]],
        keys: dict[str, str],
    ) -> None:
        # A message's sequence in the service is its 0-based position (seq) + 1.
        wanted = {
            q["conversation_key"]: {seq + 1 for seq in q["evidence_seqs"]}
            for q in questions
            if not q["abstention"] and q["evidence_seqs"]
        }
        holding: dict[str, set[str]] = defaultdict(set)
        for chunk_id, conversation_id, start in windows:
            key = keys.get(conversation_id)
            if key in wanted and any(start <= s < start + WINDOW for s in wanted[key]):
                holding[key].add(chunk_id)
        asked: set[str] = set()
        self._answers: list[frozenset[str]] = []
        for q in questions:
            first_ask = q["question_id"] not in asked
            asked.add(q["question_id"])
            self._answers.append(
                frozenset(holding.get(q["conversation_key"], ()) if first_ask else ())
            )

    @property
    def answerable(self) -> int:
        """Distinct questions whose answer the org holds (abstentions, and questions whose
        conversation the growth has not reached yet, have none)."""
        return sum(1 for answers in self._answers if answers)

    def __call__(self, found: list[list[str]]) -> float | None:
        """Share of the answerable questions whose best K found hold the answer; None when
        none is answerable."""
        if not self.answerable:
            return None
        hits = sum(
            1
            for ids, answers in zip(found, self._answers, strict=True)
            if answers and answers.intersection(ids[:K])
        )
        return hits / self.answerable
