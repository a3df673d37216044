"""Rebuilding orgs from PostgreSQL: lazy first load, load-then-apply, routing epochs, preload."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from index_service.routing import routing_epoch, shard_for
from memory_proto import index_pb2
from tests.index.helpers import (
    clustered,
    execute,
    hit_tuples,
    insert_chunks,
    search_request,
    shard,
    upsert_request,
)


async def test_first_request_loads_the_org_once(database_url: str) -> None:
    vectors = clustered(40, seed=10)
    await insert_chunks(
        database_url, "org_l", [(f"chk_{i}", f"conv_{i % 4}", vectors[i]) for i in range(40)]
    )
    # A chunk not embedded yet is not indexed.
    await insert_chunks(database_url, "org_l", [("chk_pending", "conv_0", None)])
    async with shard(database_url) as (server, stub):
        responses = await asyncio.gather(
            *(stub.Search(search_request("org_l", vectors[i], 5)) for i in range(8)),
            stub.Stats(index_pb2.StatsRequest(org_id="org_l")),
        )
        assert server.registry.loads == 1
        for i, response in enumerate(responses[:8]):
            assert response.hits[0].chunk_id == f"chk_{i}"
        assert responses[8].vectors == 40
        filtered = await stub.Search(search_request("org_l", vectors[0], 40, ["conv_2"]))
        assert {h.chunk_id for h in filtered.hits} == {f"chk_{i}" for i in range(2, 40, 4)}


async def test_a_write_to_an_org_not_loaded_loads_it_first(database_url: str) -> None:
    vectors = clustered(12, seed=11)
    await insert_chunks(
        database_url, "org_w", [(f"chk_{i}", "conv_a", vectors[i]) for i in range(10)]
    )
    async with shard(database_url) as (server, stub):
        await stub.Upsert(upsert_request("org_w", [("chk_10", "conv_b", vectors[10])]))
        await stub.Delete(index_pb2.DeleteRequest(org_id="org_w", chunk_ids=["chk_3"]))
        hits = hit_tuples(await stub.Search(search_request("org_w", vectors[0], 50)))
        assert {h[0] for h in hits} == {f"chk_{i}" for i in range(11)} - {"chk_3"}
        assert server.registry.loads == 1


async def test_a_copy_left_by_an_earlier_routing_is_reloaded(database_url: str) -> None:
    """Org X is on shard A (which has no list of its own), moves to C when C is added, then
    back to A when C goes away: the routing, and its epoch, are again those A loaded X under.
    A's copy missed the updates made while X was on C, so A must reload it."""
    shards_ab = ["a:1", "b:1"]
    shards_abc = [*shards_ab, "c:1"]
    org = next(
        f"org_{i}"
        for i in range(1000)
        if shard_for(f"org_{i}", shards_ab) == "a:1" and shard_for(f"org_{i}", shards_abc) == "c:1"
    )
    other = next(f"org_{i}" for i in range(1000) if shard_for(f"org_{i}", shards_abc) == "a:1")
    epoch_ab, epoch_abc = routing_epoch(shards_ab), routing_epoch(shards_abc)
    vectors = clustered(10, seed=12)
    await insert_chunks(database_url, org, [(f"chk_{i}", "conv", vectors[i]) for i in range(5)])
    await insert_chunks(database_url, other, [("chk_y", "conv", vectors[0])])
    async with shard(database_url) as (server_a, stub_a):
        first = await stub_a.Search(search_request(org, vectors[0], 10, epoch=epoch_ab))
        assert len(first.hits) == 5

        # While X lives on C: the indexer stores new vectors in PostgreSQL and upserts to C;
        # a deleted conversation's chunks go too. A hears nothing of it.
        await insert_chunks(
            database_url, org, [(f"chk_{i}", "conv_new", vectors[i]) for i in range(5, 10)]
        )
        await execute(
            database_url, "DELETE FROM chunks WHERE org_id = $1 AND chunk_id = 'chk_0'", org
        )
        # A window rebuilt since its vector was stored: that vector is of its old text.
        await execute(
            database_url,
            "UPDATE chunks SET version = version + 1 WHERE org_id = $1 AND chunk_id = 'chk_1'",
            org,
        )

        # Same epoch, and no other seen: A still serves the copy it has.
        same = await stub_a.Search(search_request(org, vectors[0], 10, epoch=epoch_ab))
        assert len(same.hits) == 5
        # A serves the orgs it keeps under the new routing.
        await stub_a.Search(search_request(other, vectors[0], 10, epoch=epoch_abc))
        # C goes away: X is back on A, under the epoch A loaded it with. A reloads it.
        back = await stub_a.Search(search_request(org, vectors[0], 20, epoch=epoch_ab))
        assert {h.chunk_id for h in back.hits} == {f"chk_{i}" for i in range(2, 10)}
        assert server_a.registry.loads == 3
        # Callers kept to that routing since: the copy serves.
        await stub_a.Search(search_request(org, vectors[0], 20, epoch=epoch_ab))
        assert server_a.registry.loads == 3


async def test_start_preloads_the_orgs_this_shard_owns(database_url: str) -> None:
    shards = ["s0", "s1", "s2"]
    orgs = [f"org_{i}" for i in range(12)]
    vector = clustered(1, seed=13)[0]
    for org in orgs:
        await insert_chunks(database_url, org, [(f"chk_{org}", "conv", vector)])
    owned = [org for org in orgs if shard_for(org, shards) == "s1"]
    async with shard(database_url, shards=shards, shard_name="s1") as (server, stub):
        await server.wait_ready()
        health = await stub.Health(index_pb2.IndexHealthRequest())
        assert health.ready and health.orgs == len(owned) > 0
        epoch = routing_epoch(shards)
        for org in owned:
            await stub.Search(search_request(org, vector, 1, epoch=epoch))
        assert server.registry.loads == len(owned)


async def test_an_unreachable_database_is_unavailable() -> None:
    url = "postgresql://postgres@127.0.0.1:9/none"
    async with shard(url) as (_, stub):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Search(search_request("org", clustered(1, seed=1)[0], 1))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_shard_name_must_be_listed() -> None:
    from index_service.main import start_server
    from index_service.settings import IndexSettings

    settings = IndexSettings(port=0, database_url=None, shards=["a"], shard_name="b")
    with pytest.raises(ValueError, match="INDEX_SHARD_NAME"):
        asyncio.run(start_server(settings))


def test_a_flat_threshold_too_small_for_an_ivf_index_is_refused() -> None:
    from pydantic import ValidationError

    from index_service.settings import IndexSettings

    with pytest.raises(ValidationError, match="flat_threshold"):
        IndexSettings(flat_threshold=15)
    assert IndexSettings(flat_threshold=16).flat_threshold == 16
