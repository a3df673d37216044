"""Rendezvous routing: stable, order-independent, minimal movement on shard changes."""

from __future__ import annotations

from collections import Counter

import pytest

from index_service.routing import routing_epoch, shard_for

ORGS = [f"org_{i}" for i in range(5000)]
SHARDS = ["index-0:50061", "index-1:50061", "index-2:50061", "index-3:50061"]


def test_routing_is_deterministic_and_order_independent() -> None:
    first = [shard_for(org, SHARDS) for org in ORGS]
    assert first == [shard_for(org, list(reversed(SHARDS))) for org in ORGS]
    assert first == [shard_for(org, SHARDS + SHARDS[:1]) for org in ORGS]
    # Pinned values: every process and release must route alike.
    assert [shard_for(f"org_{i}", SHARDS) for i in range(3)] == [
        "index-1:50061",
        "index-2:50061",
        "index-2:50061",
    ]
    assert routing_epoch(SHARDS) == 2882764996189647676


def test_routing_spreads_orgs_evenly() -> None:
    counts = Counter(shard_for(org, SHARDS) for org in ORGS)
    assert set(counts) == set(SHARDS)
    assert all(abs(c - len(ORGS) / 4) < len(ORGS) * 0.05 for c in counts.values())


def test_adding_a_shard_moves_only_the_orgs_it_takes_over() -> None:
    grown = [*SHARDS, "index-4:50061"]
    moved = [org for org in ORGS if shard_for(org, SHARDS) != shard_for(org, grown)]
    assert all(shard_for(org, grown) == "index-4:50061" for org in moved)
    assert abs(len(moved) - len(ORGS) / 5) < len(ORGS) * 0.04


def test_removing_a_shard_moves_only_its_orgs() -> None:
    shrunk = SHARDS[:3]
    for org in ORGS:
        before = shard_for(org, SHARDS)
        if before != SHARDS[3]:
            assert shard_for(org, shrunk) == before


def test_no_shards_is_an_error() -> None:
    with pytest.raises(ValueError, match="no shards"):
        shard_for("org", [])


def test_routing_epoch_names_the_shard_set() -> None:
    assert routing_epoch(SHARDS) == routing_epoch(list(reversed(SHARDS)))
    assert routing_epoch(SHARDS) != routing_epoch(SHARDS[:3])
    assert 0 < routing_epoch(SHARDS) < 2**63
