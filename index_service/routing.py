"""Org-to-shard routing by rendezvous (highest-random-weight) hashing.

Every org goes to the shard with the highest hash of (shard, org). Adding a shard moves only
the orgs whose new highest weight is that shard; removing one moves only the orgs it held. The
hash is blake2b, so every process (and every Python version) agrees on the routing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def _weight(org_id: str, shard: str) -> int:
    # A separator byte keeps ("ab", "c") and ("a", "bc") apart.
    digest = hashlib.blake2b(
        shard.encode() + b"\x00" + org_id.encode(), digest_size=8, person=b"memshard"
    ).digest()
    return int.from_bytes(digest, "big")


def shard_for(org_id: str, shards: Sequence[str]) -> str:
    """The shard (address or name, as given) that owns `org_id`.

    Raises ValueError when `shards` is empty. Duplicates and order do not matter.
    """
    if not shards:
        raise ValueError("no shards configured")
    return max(shards, key=lambda shard: (_weight(org_id, shard), shard))


def routing_epoch(shards: Sequence[str]) -> int:
    """A nonzero 63-bit number identifying the shard set, for the requests' routing_epoch.

    Callers that route with `shards` send this value; a shard that loaded an org under another
    epoch reloads it before answering (Registry._serves says when). A list that comes back
    comes back with its epoch. Order and duplicates do not matter.
    """
    canonical = "\n".join(sorted(set(shards))).encode()
    digest = hashlib.blake2b(canonical, digest_size=8, person=b"memepoch").digest()
    return (int.from_bytes(digest, "big") >> 1) or 1
