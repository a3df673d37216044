from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.api.harness import Service, running_service


@pytest.fixture
async def service(database_url: str) -> AsyncIterator[Service]:
    async with running_service(database_url) as svc:
        yield svc


@pytest.fixture
async def key(service: Service) -> str:
    _, secret = await service.org_with_key()
    return secret
