"""The gRPC service on a loopback port, without a database."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from index_service.stores import SCORE_TOLERANCE
from memory_proto import index_pb2
from tests.index.helpers import DIM, clustered, hit_tuples, search_request, shard, upsert_request


async def test_upsert_search_replace_delete() -> None:
    vectors = clustered(50, seed=1)
    async with shard() as (_, stub):
        chunks = [(f"chk_{i}", f"conv_{i % 5}", vectors[i]) for i in range(50)]
        assert (await stub.Upsert(upsert_request("org_a", chunks))).upserted == 50
        top = await stub.Search(search_request("org_a", vectors[7], 3))
        assert top.hits[0].chunk_id == "chk_7"
        assert top.hits[0].score == pytest.approx(1.0, abs=1e-5)
        assert [h.score for h in top.hits] == sorted((h.score for h in top.hits), reverse=True)

        # Replace chk_7's vector and conversation: the next search sees only the new one.
        await stub.Upsert(upsert_request("org_a", [("chk_7", "conv_new", vectors[8])]))
        hits = hit_tuples(await stub.Search(search_request("org_a", vectors[8], 2)))
        assert {h[0] for h in hits} == {"chk_7", "chk_8"}
        assert ("chk_7", "conv_new") in {(h[0], h[1]) for h in hits}
        stats = await stub.Stats(index_pb2.StatsRequest(org_id="org_a"))
        assert (stats.vectors, stats.index_kind) == (50, "flat")

        deleted = await stub.Delete(index_pb2.DeleteRequest(org_id="org_a", chunk_ids=["chk_8"]))
        assert deleted.deleted == 1
        hits = hit_tuples(await stub.Search(search_request("org_a", vectors[8], 50)))
        assert "chk_8" not in {h[0] for h in hits} and len(hits) == 49

        by_conv = await stub.Delete(
            index_pb2.DeleteRequest(org_id="org_a", conversation_ids=["conv_1"])
        )
        assert by_conv.deleted == 10
        hits = hit_tuples(await stub.Search(search_request("org_a", vectors[1], 50)))
        assert len(hits) == 39 and "conv_1" not in {h[1] for h in hits}
        assert not (await stub.Search(search_request("org_a", vectors[1], 5, ["conv_1"]))).hits

        dropped = await stub.DropOrg(index_pb2.DropOrgRequest(org_id="org_a"))
        assert dropped.deleted == 39
        assert not (await stub.Search(search_request("org_a", vectors[1], 5))).hits


@pytest.mark.parametrize("threshold", [100_000, 500], ids=["flat", "ivf"])
async def test_filters_are_exact_even_for_low_ranking_conversations(threshold: int) -> None:
    vectors = clustered(3000, seed=2)
    query = clustered(1, seed=77)[0]
    order = np.argsort(vectors @ query)  # ascending: the first chunks rank lowest
    low = {int(i) for i in order[:30]}
    chunks = [
        (f"chk_{i}", "conv_low" if i in low else f"conv_{i % 20}", vectors[i]) for i in range(3000)
    ]
    async with shard(flat_threshold=threshold) as (server, stub):
        for start in range(0, 3000, 500):
            await stub.Upsert(upsert_request("org_f", chunks[start : start + 500]))
        await server.registry.settle()
        kind = (await stub.Stats(index_pb2.StatsRequest(org_id="org_f"))).index_kind
        assert kind == ("flat" if threshold > 3000 else "ivf")
        unfiltered = await stub.Search(search_request("org_f", query, 10))
        assert "conv_low" not in {h.conversation_id for h in unfiltered.hits}

        hits = hit_tuples(await stub.Search(search_request("org_f", query, 20, ["conv_low"])))
        expected = sorted(low, key=lambda i: -float(vectors[i] @ query))[:20]
        assert [h[0] for h in hits] == [f"chk_{i}" for i in expected]

        both = hit_tuples(
            await stub.Search(search_request("org_f", query, 50, ["conv_low", "conv_3"]))
        )
        assert len(both) == 50 and {h[1] for h in both} <= {"conv_low", "conv_3"}
        unknown = await stub.Search(search_request("org_f", query, 5, ["conv_missing"]))
        assert not unknown.hits


@pytest.mark.parametrize("threshold", [100_000, 500], ids=["flat", "ivf"])
async def test_nprobe_trades_recall_for_reading_fewer_lists(threshold: int) -> None:
    vectors = clustered(3000, seed=8, spread=4.0)  # loose topics: neighbours span lists
    queries = clustered(40, seed=9, spread=4.0)
    exact_kth = -np.sort(-(queries @ vectors.T), axis=1)[:, 9]
    chunks = [(f"chk_{i}", f"conv_{i % 20}", vectors[i]) for i in range(3000)]

    async def recall(nprobe: int) -> float:
        hits = 0
        for query, kth in zip(queries, exact_kth, strict=True):
            request = search_request("org_p", query, 10)
            request.nprobe = nprobe
            scores = [h.score for h in (await stub.Search(request)).hits]
            hits += sum(score >= kth - SCORE_TOLERANCE for score in scores)
        return hits / (10 * len(queries))

    async with shard(flat_threshold=threshold) as (server, stub):
        for start in range(0, 3000, 500):
            await stub.Upsert(upsert_request("org_p", chunks[start : start + 500]))
        await server.registry.settle()
        stats = await stub.Stats(index_pb2.StatsRequest(org_id="org_p"))
        if threshold > 3000:  # exact search has no lists: nprobe changes nothing
            assert (stats.nlist, stats.nprobe) == (0, 0)
            assert await recall(1) == await recall(0) == 1.0
            return
        assert 1 < stats.nprobe < stats.nlist
        assert await recall(stats.nprobe) == await recall(0)  # 0: the calibrated number
        assert await recall(1 << 20) == 1.0  # more than the org's lists: all of them
        assert await recall(1) < await recall(0) <= 1.0


async def test_orgs_are_isolated_in_one_shard() -> None:
    vectors = clustered(20, seed=4)
    async with shard() as (_, stub):
        await stub.Upsert(upsert_request("org_a", [(f"a{i}", "c1", vectors[i]) for i in range(10)]))
        await stub.Upsert(upsert_request("org_b", [(f"b{i}", "c1", vectors[i]) for i in range(20)]))
        hits_a = await stub.Search(search_request("org_a", vectors[15], 50))
        assert {h.chunk_id for h in hits_a.hits} == {f"a{i}" for i in range(10)}
        # Same chunk and conversation ids in another org are other chunks.
        await stub.Upsert(upsert_request("org_b", [("a1", "c1", vectors[19])]))
        await stub.Delete(index_pb2.DeleteRequest(org_id="org_b", conversation_ids=["c1"]))
        assert len((await stub.Search(search_request("org_a", vectors[1], 50))).hits) == 10
        assert not (await stub.Search(search_request("org_b", vectors[1], 50))).hits
        totals = await stub.Stats(index_pb2.StatsRequest())
        assert (totals.vectors, totals.orgs) == (10, 2)


async def test_growing_past_the_threshold_switches_to_ivf_and_keeps_answers() -> None:
    vectors = clustered(2400, seed=6)
    async with shard(flat_threshold=1000) as (server, stub):
        for start in range(0, 2400, 200):
            chunks = [(f"chk_{i}", f"conv_{i % 7}", vectors[i]) for i in range(start, start + 200)]
            await stub.Upsert(upsert_request("org_g", chunks))
            # Every write is visible at once, whatever the rebuild is doing.
            top = await stub.Search(search_request("org_g", vectors[start + 199], 1))
            assert top.hits[0].chunk_id == f"chk_{start + 199}"
        await server.registry.settle()
        stats = await stub.Stats(index_pb2.StatsRequest(org_id="org_g"))
        assert (stats.vectors, stats.index_kind, stats.building) == (2400, "ivf", False)
        for i in (0, 999, 2399):
            assert (await stub.Search(search_request("org_g", vectors[i], 1))).hits[
                0
            ].chunk_id == f"chk_{i}"


def _bad(field: str) -> index_pb2.SearchRequest | index_pb2.UpsertRequest:
    good = clustered(1, seed=8)[0]
    if field == "upsert_nan":
        bad = good.copy()
        bad[3] = np.nan
        return upsert_request("org", [("c", "v", bad)])
    if field == "upsert_inf":
        bad = good.copy()
        bad[0] = np.inf
        return upsert_request("org", [("c", "v", bad)])
    if field == "upsert_zero":
        return upsert_request("org", [("c", "v", np.zeros(DIM, np.float32))])
    if field == "upsert_short_vector":
        return upsert_request("org", [("c", "v", good[:100])])
    if field == "upsert_wrong_dim":
        request = upsert_request("org", [("c", "v", good)])
        request.dim = 384
        return request
    if field == "upsert_empty_org":
        return upsert_request("", [("c", "v", good)])
    if field == "upsert_empty_chunk":
        return upsert_request("org", [("", "v", good)])
    if field == "search_k0":
        return search_request("org", good, 0)
    if field == "search_k_too_big":
        return search_request("org", good, 100_000)
    if field == "search_wrong_dim":
        return search_request("org", good[:384], 10)
    if field == "search_nan":
        bad = good.copy()
        bad[1] = np.nan
        return search_request("org", bad, 10)
    return search_request("", good, 10)


@pytest.mark.parametrize(
    "case",
    [
        "upsert_nan",
        "upsert_inf",
        "upsert_zero",
        "upsert_short_vector",
        "upsert_wrong_dim",
        "upsert_empty_org",
        "upsert_empty_chunk",
        "search_k0",
        "search_k_too_big",
        "search_wrong_dim",
        "search_nan",
        "search_empty_org",
    ],
)
async def test_invalid_arguments(case: str) -> None:
    request = _bad(case)
    async with shard() as (_, stub):
        call = stub.Upsert if isinstance(request, index_pb2.UpsertRequest) else stub.Search
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(request)  # type: ignore[operator]
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # Nothing partial was stored.
        assert (await stub.Stats(index_pb2.StatsRequest())).vectors == 0


@pytest.mark.parametrize("scale", [3e38, 1e20, 1e-25, 1e-40])
async def test_vectors_near_float32_limits_keep_their_direction(scale: float) -> None:
    """Squared in float32, such components overflow to infinity or vanish; the vectors must
    still be stored unit-length, each one nearest to itself."""
    vectors = clustered(20, seed=9)
    peaks = np.abs(vectors).max(axis=1, keepdims=True)
    extreme = (vectors / peaks * np.float32(scale)).astype(np.float32)
    assert np.isfinite(extreme).all() and (np.abs(extreme).max(axis=1) > 0).all()
    async with shard() as (_, stub):
        chunks = [(f"chk_{i}", "conv", extreme[i]) for i in range(20)]
        assert (await stub.Upsert(upsert_request("org", chunks))).upserted == 20
        for i in (0, 7, 19):
            top = await stub.Search(search_request("org", extreme[i], 1))
            assert top.hits[0].chunk_id == f"chk_{i}"
            assert top.hits[0].score == pytest.approx(1.0, abs=1e-3)
            # The same direction at an ordinary scale finds it too, with the same score.
            top = await stub.Search(search_request("org", vectors[i], 1))
            assert top.hits[0].chunk_id == f"chk_{i}"
            assert top.hits[0].score == pytest.approx(1.0, abs=1e-3)


async def test_delete_and_drop_validation() -> None:
    async with shard() as (_, stub):
        for call, request in [
            (stub.Delete, index_pb2.DeleteRequest(org_id="org")),
            (stub.Delete, index_pb2.DeleteRequest(org_id="", chunk_ids=["x"])),
            (stub.DropOrg, index_pb2.DropOrgRequest(org_id="")),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call(request)  # type: ignore[operator]
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_health() -> None:
    async with shard() as (server, stub):
        await server.wait_ready()
        health = await stub.Health(index_pb2.IndexHealthRequest())
        assert (health.ready, health.device, health.orgs) == (True, "cpu", 0)
