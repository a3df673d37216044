"""EmbedService through a real grpc.aio server on port 0 and the generated client."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest

from embed_service import main
from embed_service.embedder import Embedder
from embed_service.main import EmbedServer, start_server
from embed_service.model import TransformerEmbedder
from embed_service.settings import EmbedSettings
from memory_proto import embed_pb2, embed_pb2_grpc
from tests.embed.fakes import FakeEmbedder


def _decode(response: embed_pb2.EmbedResponse) -> np.ndarray:
    return np.frombuffer(response.vectors, dtype="<f4").reshape(-1, response.dim)


@pytest.fixture(scope="module")
async def hashing_server() -> AsyncIterator[EmbedServer]:
    settings = EmbedSettings(
        backend="hashing", port=0, max_texts_per_call=4, max_text_chars=50, max_queued_texts=4
    )
    server = await start_server(settings)
    yield server
    await server.stop(grace=1.0)


@pytest.fixture
async def hashing_stub(
    hashing_server: EmbedServer,
) -> AsyncIterator[embed_pb2_grpc.EmbedServiceStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{hashing_server.port}") as channel:
        yield embed_pb2_grpc.EmbedServiceStub(channel)


async def test_hashing_server_embeds_in_order(
    hashing_stub: embed_pb2_grpc.EmbedServiceStub,
) -> None:
    response = await hashing_stub.Embed(embed_pb2.EmbedRequest(texts=["red apple", "blue sky"]))
    vectors = _decode(response)
    assert response.dim == 768 and response.model == "hashing-768"
    assert vectors.shape == (2, 768)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    again = _decode(await hashing_stub.Embed(embed_pb2.EmbedRequest(texts=["blue sky"])))
    np.testing.assert_array_equal(again[0], vectors[1])


@pytest.mark.parametrize(
    ("texts", "code"),
    [
        ([], grpc.StatusCode.INVALID_ARGUMENT),
        (["a"] * 5, grpc.StatusCode.INVALID_ARGUMENT),
        (["x" * 51], grpc.StatusCode.INVALID_ARGUMENT),
    ],
    ids=["empty", "too-many", "too-long"],
)
async def test_limits_map_to_status_codes(
    hashing_stub: embed_pb2_grpc.EmbedServiceStub, texts: list[str], code: grpc.StatusCode
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await hashing_stub.Embed(embed_pb2.EmbedRequest(texts=texts))
    assert caught.value.code() == code


async def test_past_the_admission_bound_is_resource_exhausted() -> None:
    """Texts already in flight leave no room for a call: retry later. A call that could never
    fit is a setting refused at start."""
    fake = FakeEmbedder(asyncio.get_running_loop())
    fake.gate.clear()  # the model holds what it is given
    settings = EmbedSettings(port=0, max_texts_per_call=4, max_queued_texts=4)
    server = await start_server(settings, embedder=fake)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = embed_pb2_grpc.EmbedServiceStub(channel)
            held = stub.Embed(embed_pb2.EmbedRequest(texts=["a", "b", "c"]))  # under way
            await fake.entered.wait()
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Embed(embed_pb2.EmbedRequest(texts=["d", "e"]))
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            fake.gate.set()
            assert (await held).dim == fake.dim
    finally:
        fake.gate.set()
        await server.stop(grace=1.0)
    with pytest.raises(ValueError, match="EMBED_MAX_QUEUED_TEXTS"):
        EmbedSettings(max_texts_per_call=4, max_queued_texts=3)


async def test_not_ready_is_unavailable_once_shutdown_begins() -> None:
    server = await start_server(EmbedSettings(backend="hashing", port=0))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = embed_pb2_grpc.EmbedServiceStub(channel)
            assert (await stub.Health(embed_pb2.HealthRequest())).ready
            server.servicer.stop_serving()
            assert not (await stub.Health(embed_pb2.HealthRequest())).ready
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Embed(embed_pb2.EmbedRequest(texts=["hi"]))
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(grace=1.0)


async def test_the_model_loads_on_a_thread_that_has_ended_when_serving_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Torch keeps an OpenMP team for each thread it ran on; a loading thread left alive
    beside the model thread puts more OpenMP threads than cores on a small machine, and
    OpenMP then sleeps between parallel regions (embed_service.main)."""
    loaded_on: list[threading.Thread] = []
    load = main.load_embedder

    def recording(settings: EmbedSettings) -> Embedder:
        loaded_on.append(threading.current_thread())
        return load(settings)

    monkeypatch.setattr(main, "load_embedder", recording)
    server = await start_server(EmbedSettings(backend="hashing", port=0))
    try:
        (thread,) = loaded_on
        assert thread is not threading.main_thread() and not thread.is_alive()
        assert thread.name.startswith("embed-load")
    finally:
        await server.stop(grace=1.0)


@pytest.mark.model
async def test_real_model_through_grpc(
    real_model: TransformerEmbedder, model_settings: EmbedSettings
) -> None:
    server = await start_server(model_settings, embedder=real_model)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = embed_pb2_grpc.EmbedServiceStub(channel)
            health = await stub.Health(embed_pb2.HealthRequest())
            assert (health.ready, health.model, health.dim, health.device) == (
                True,
                "all-mpnet-base-v2",
                768,
                "cpu",
            )
            texts = ["The meeting moved to Thursday.", "Bring the quarterly report."]
            response = await stub.Embed(embed_pb2.EmbedRequest(texts=texts))
            vectors = _decode(response)
            assert response.model == "all-mpnet-base-v2" and vectors.shape == (2, 768)
            direct = real_model.embed(real_model.tokenize(texts))
            np.testing.assert_allclose(vectors, direct, atol=1e-3)
    finally:
        await server.stop(grace=1.0)
