"""Schemathesis over the committed OpenAPI document against the live service with a valid key:
every operation, valid (positive) and invalid (negative) inputs, and valid inputs aimed at a
real conversation and message. No 5xx; status codes, content types and bodies match the
document; invalid input is refused.

Negative cases come from the document less what no request can get wrong on the wire: every
query value arrives as a string, so a query parameter that takes any string cannot be made
invalid (a "negated" one-element array or number is sent as a valid string), and the key is
the valid one the test sends with every request."""

from __future__ import annotations

import asyncio
import copy
import json
from collections import Counter
from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.api.harness import Service

OPENAPI = Path(__file__).parents[2] / "api_service" / "contract" / "openapi.json"
EXAMPLES = 25
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def _takes_any_string(schema: dict[str, Any]) -> bool:
    """A schema every query value meets: a string without constraints, or null besides."""
    annotations = {"title", "description", "default"}
    branches = schema.get("anyOf", [schema])
    return {b.get("type") for b in branches} <= {"string", "null"} and all(
        set(b) - annotations <= {"type"} for b in branches
    )


def _negatable(document: dict[str, Any]) -> dict[str, Any]:
    """`document` without its security scheme, and with every query parameter that takes any
    string left free (an empty schema), so that negation picks what a request can break."""
    document = copy.deepcopy(document)
    document.pop("security", None)
    document.get("components", {}).pop("securitySchemes", None)
    for operations in document["paths"].values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "query" and _takes_any_string(parameter["schema"]):
                    parameter["schema"] = {}
    return document


def _can_negate(operation: Any) -> bool:
    """Negative data needs a query parameter or a body; any string is a valid path id."""
    return bool(operation.body) or any(p.location == "query" for p in operation.iter_parameters())


def _run(
    operation: Any,
    mode: GenerationMode,
    path_parameters: dict[str, str] | None,
    base_url: str,
    headers: dict[str, str],
) -> int:
    """Send up to EXAMPLES generated requests for one operation; returns how many were sent."""
    checks = [*CHECKS, negative_data_rejection] if mode is GenerationMode.NEGATIVE else CHECKS
    sent = 0

    @given(case=operation.as_strategy(generation_mode=mode, path_parameters=path_parameters))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Case) -> None:
        nonlocal sent
        sent += 1
        response = case.call(base_url=base_url, headers=headers, timeout=30)
        case.validate_response(response, checks=checks, headers=headers)

    run()
    return sent


def _fuzz(base_url: str, key: str, cid: str, mid: str) -> Counter[str]:
    document = json.loads(OPENAPI.read_text())
    schema = schemathesis.openapi.from_dict(document)
    negatable = {
        result.ok().label: result.ok()
        for result in schemathesis.openapi.from_dict(_negatable(document)).get_all_operations()
    }
    headers = {"Authorization": f"Bearer {key}"}
    ran: Counter[str] = Counter()
    runs: list[tuple[Any, GenerationMode, dict[str, str] | None]] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        runs.append((operation, GenerationMode.POSITIVE, None))
        if _can_negate(negatable[operation.label]):
            runs.append((negatable[operation.label], GenerationMode.NEGATIVE, None))
        path_names = {p.name for p in operation.iter_parameters() if p.location == "path"}
        if path_names:
            real = {"conversation_id": cid, "message_id": mid}
            runs.append((operation, GenerationMode.POSITIVE, {n: real[n] for n in path_names}))
    runs.sort(key=lambda run: run[0].method.upper() == "DELETE")  # the real ids stay until last
    for operation, mode, path_parameters in runs:
        label = f"{operation.label} {mode.value}{' (real ids)' if path_parameters else ''}"
        ran[label] = _run(operation, mode, path_parameters, base_url, headers)
    return ran


async def test_openapi_operations_hold_their_contract_under_fuzzing(
    service: Service, key: str
) -> None:
    async with service.rest(key) as http:
        cid = (await http.post("/api/v1/conversations", json={"title": "t"})).json()[
            "conversation_id"
        ]
        appended = await http.post(
            "/api/v1/messages",
            json={"conversation_id": cid, "messages": [{"role": "user", "content": "hello"}]},
        )
        mid = appended.json()["message_ids"][0]
    # Schemathesis sends with a blocking client; the service answers on this event loop.
    ran = await asyncio.to_thread(_fuzz, service.base_url, key, cid, mid)
    assert len({label.split(" ")[1] for label in ran}) == 6, ran  # paths
    assert len(ran) == 17 and all(count >= 1 for count in ran.values()), ran
    print(f"schemathesis: {len(ran)} runs, {sum(ran.values())} requests: {dict(ran)}")
