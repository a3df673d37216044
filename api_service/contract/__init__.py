"""Committed contract files: the OpenAPI document and the MCP tool list (names and schemas).

`python -m api_service.contract` rewrites them from the code; tests fail when they drift.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OPENAPI_FILE = HERE / "openapi.json"
MCP_TOOLS_FILE = HERE / "mcp_tools.json"


def dumps(document: Any) -> str:
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def live_openapi() -> dict[str, Any]:
    from api_service.main import create_app
    from api_service.settings import ApiSettings

    document: dict[str, Any] = create_app(ApiSettings()).openapi()
    return document


async def live_mcp_tools() -> list[dict[str, Any]]:
    from api_service.mcp_server import build_mcp

    def unstarted() -> Any:
        raise RuntimeError("listing tools needs no running service")

    tools = await build_mcp(unstarted).list_tools()
    return [
        {"name": t.name, "description": t.description, "inputSchema": t.input_schema}
        for t in sorted(tools, key=lambda t: t.name)
    ]
