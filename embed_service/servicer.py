"""gRPC adapter: validate, hand texts to the batcher, encode vectors compactly."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc

from embed_service.batcher import Batcher
from embed_service.embedder import Embedder
from embed_service.errors import EmbedError, InvalidInput, NotReady, status_for
from memory_proto import embed_pb2, embed_pb2_grpc

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RequestLimits:
    """Bounds on one Embed call."""

    max_texts_per_call: int
    max_text_chars: int


def validate_texts(texts: list[str], limits: RequestLimits) -> None:
    """Raise InvalidInput when the call has no texts, too many, or one too long."""
    if not texts:
        raise InvalidInput("texts must hold at least one text")
    if len(texts) > limits.max_texts_per_call:
        raise InvalidInput(f"too many texts: {len(texts)} > {limits.max_texts_per_call} per call")
    for i, text in enumerate(texts):
        if len(text) > limits.max_text_chars:
            # The text itself is never echoed or logged.
            raise InvalidInput(
                f"texts[{i}] has {len(text)} characters, more than {limits.max_text_chars}"
            )


class EmbedServicer(embed_pb2_grpc.EmbedServiceServicer):
    """EmbedService over a Batcher; errors are mapped to statuses in one place."""

    def __init__(self, embedder: Embedder, batcher: Batcher, limits: RequestLimits) -> None:
        self._embedder = embedder
        self._batcher = batcher
        self._limits = limits
        self._serving = True

    def stop_serving(self) -> None:
        """Report not ready from now on (used at shutdown)."""
        self._serving = False

    @property
    def ready(self) -> bool:
        """True while the model is loaded, the worker runs and shutdown has not begun."""
        return self._serving and self._batcher.alive

    async def Embed(
        self,
        request: embed_pb2.EmbedRequest,
        context: grpc.aio.ServicerContext[embed_pb2.EmbedRequest, embed_pb2.EmbedResponse],
    ) -> embed_pb2.EmbedResponse:
        """Embed the request's texts; vectors come back as little-endian float32, row-major."""
        texts = list(request.texts)
        try:
            if not self.ready:
                raise NotReady("embedding service is not ready")
            validate_texts(texts, self._limits)
            vectors = await self._batcher.embed(texts)
        except EmbedError as exc:
            await context.abort(status_for(exc), str(exc))
        return embed_pb2.EmbedResponse(
            dim=self._embedder.dim,
            vectors=vectors.astype("<f4", copy=False).tobytes(),
            model=self._embedder.name,
        )

    async def Health(
        self,
        request: embed_pb2.HealthRequest,
        context: grpc.aio.ServicerContext[embed_pb2.HealthRequest, embed_pb2.HealthResponse],
    ) -> embed_pb2.HealthResponse:
        """Readiness, model name, dimension and device."""
        return embed_pb2.HealthResponse(
            ready=self.ready,
            model=self._embedder.name,
            dim=self._embedder.dim,
            device=self._embedder.device,
        )
