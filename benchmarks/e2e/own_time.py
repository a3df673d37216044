"""A request's own time: its Server-Timing total less what the embedding held up.

Kept apart from run.py, with nothing of the service imported, so that append_ab.py can time
older commits' stacks by this checkout's rule.
"""

from __future__ import annotations


def without_embedding(parts: dict[str, float]) -> float:
    """A request's Server-Timing total, in milliseconds, less the time the embedding held up
    its answer.

    An append embeds during its transaction; `embed_wait` is what was left after the commit.
    A hybrid search embeds the query and searches the shard while PostgreSQL ranks the full
    text: that stage takes max(embed + index, lexical), and would take max(index, lexical)
    without the embedding (a vector-only search has no lexical part: the whole embed)."""
    if "embed_wait" in parts:
        return parts["total"] - parts["embed_wait"]
    embed, index, lexical = (parts.get(name, 0.0) for name in ("embed", "index", "lexical"))
    return parts["total"] - (max(embed + index, lexical) - max(index, lexical))
