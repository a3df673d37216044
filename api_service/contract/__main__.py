"""Rewrite the committed contract files from the code."""

import asyncio

from api_service.contract import MCP_TOOLS_FILE, OPENAPI_FILE, dumps, live_mcp_tools, live_openapi

OPENAPI_FILE.write_text(dumps(live_openapi()))
MCP_TOOLS_FILE.write_text(dumps(asyncio.run(live_mcp_tools())))
print(f"wrote {OPENAPI_FILE} and {MCP_TOOLS_FILE}")
