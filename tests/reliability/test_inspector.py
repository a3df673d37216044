"""Interoperability with an independent MCP client: the MCP Inspector's CLI (TypeScript SDK)
lists the six tools and calls each one against a running service over Streamable HTTP.

The Inspector version is pinned in inspector/package.json and package-lock.json; the first run
installs it into inspector/node_modules with `npm ci`."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.api.harness import Service

INSPECTOR_DIR = Path(__file__).parent / "inspector"
INSPECTOR_BIN = INSPECTOR_DIR / "node_modules" / ".bin" / "mcp-inspector"
CONTRACT_TOOLS = Path(__file__).parents[2] / "api_service" / "contract" / "mcp_tools.json"
TOOL_IS_ERROR_EXIT = 5


def _pinned_version() -> str:
    package = json.loads((INSPECTOR_DIR / "package.json").read_text())
    version: str = package["dependencies"]["@modelcontextprotocol/inspector"]
    return version


def _installed_version() -> str | None:
    manifest = INSPECTOR_DIR / "node_modules/@modelcontextprotocol/inspector/package.json"
    if not manifest.exists() or not INSPECTOR_BIN.exists():
        return None
    version: str = json.loads(manifest.read_text())["version"]
    return version


@pytest.fixture(scope="session")
def inspector_bin() -> Path:
    """The pinned Inspector, installed from the lock file when missing or stale."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js and npm are needed to run the MCP Inspector")
    if _installed_version() != _pinned_version():
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
            cwd=INSPECTOR_DIR,
            check=True,
            capture_output=True,
            timeout=300,
        )
    assert _installed_version() == _pinned_version()
    return INSPECTOR_BIN


class Inspector:
    def __init__(self, binary: Path, service: Service, key: str, home: Path) -> None:
        self.binary = binary
        self.url = f"{service.base_url}/mcp"
        self.key = key
        # The Inspector keeps a catalog and OAuth storage under HOME; keep them out of the user's.
        self.env = {
            **os.environ,
            "HOME": str(home),
            "MCP_CATALOG_PATH": str(home / "catalog.json"),
            "NO_COLOR": "1",
        }

    async def run(self, *args: str) -> tuple[int, Any]:
        """(exit status, the JSON the Inspector printed on stdout)."""
        proc = await asyncio.create_subprocess_exec(
            str(self.binary),
            "--cli",
            self.url,
            "--transport",
            "http",
            "--header",
            f"Authorization: Bearer {self.key}",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
        assert out.strip(), f"no output; stderr: {err.decode(errors='replace')}"
        return proc.returncode or 0, json.loads(out)

    async def call(self, tool: str, *tool_args: str) -> tuple[int, dict[str, Any]]:
        """Call a tool; checks the text content carries the structured object."""
        args = ["--method", "tools/call", "--tool-name", tool]
        if tool_args:
            args += ["--tool-arg", *tool_args]
        status, result = await self.run(*args)
        payload: dict[str, Any] = result["structuredContent"]
        assert json.loads(result["content"][0]["text"]) == payload
        assert (status == TOOL_IS_ERROR_EXIT) == bool(result.get("isError")), (status, result)
        return status, payload

    async def ok(self, tool: str, *tool_args: str) -> dict[str, Any]:
        status, payload = await self.call(tool, *tool_args)
        assert status == 0, payload
        return payload


async def test_inspector_lists_and_calls_all_six_tools(
    service: Service, key: str, inspector_bin: Path, tmp_path: Path
) -> None:
    inspector = Inspector(inspector_bin, service, key, tmp_path)

    status, listed = await inspector.run("--method", "tools/list")
    assert status == 0
    committed = {t["name"]: t for t in json.loads(CONTRACT_TOOLS.read_text())}
    tools = {t["name"]: t for t in listed["tools"]}
    assert sorted(tools) == sorted(committed) and len(tools) == 6
    for name, tool in tools.items():
        assert tool["inputSchema"] == committed[name]["inputSchema"], name
    status, _ = await inspector.run("--method", "tools/list", "--strict")
    assert status == 0, "the Inspector found error-severity portability problems in the schemas"

    created = await inspector.ok(
        "create_conversation",
        "title=Inspector trip",
        "agent_id=inspector-agent",
        'tags=["travel","inspector"]',
        'metadata={"project":"interop","n":3}',
    )
    cid = created["conversation_id"]
    assert cid.startswith("conv_")

    messages = [
        {"role": "user", "content": "Book me a window seat to Lisbon on May 3"},
        {"role": "assistant", "content": "Done: flight TP 1351, seat 14A.", "tool_name": "book"},
    ]
    appended = await inspector.ok(
        "append_messages", f"conversation_id={cid}", f"messages={json.dumps(messages)}"
    )
    assert appended["appended"] == 2 and len(appended["message_ids"]) == 2

    found = await inspector.ok(
        "search", "query=window seat to Lisbon", f"conversation_id={cid}", "limit=3"
    )
    assert found["total"] == len(found["results"]) >= 1
    hit = found["results"][0]
    assert hit["conversation_id"] == cid and "window seat to Lisbon" in hit["chunk_text"]

    got = await inspector.ok(
        "get_conversation",
        f"conversation_id={cid}",
        f"message_offset={hit['start_sequence'] - 1}",
        "message_limit=10",
    )
    conversation = got["conversation"]
    assert conversation["title"] == "Inspector trip"
    assert conversation["agent_id"] == "inspector-agent"
    assert conversation["tags"] == ["travel", "inspector"]
    assert conversation["metadata"] == {"project": "interop", "n": 3}
    assert [(m["role"], m["content"]) for m in got["messages"]] == [
        (m["role"], m["content"]) for m in messages
    ]
    assert [m["id"] for m in got["messages"]] == appended["message_ids"]

    listed_convs = await inspector.ok(
        "list_conversations", 'tags=["inspector"]', "sort=message_count", "order=asc"
    )
    assert listed_convs["total"] == 1
    assert [c["id"] for c in listed_convs["conversations"]] == [cid]
    assert listed_convs["conversations"][0]["message_count"] == 2

    async with service.rest(key) as http:  # what the Inspector wrote, seen through REST
        rest_view = (await http.get(f"/api/v1/conversations/{cid}")).json()
        assert rest_view["messages"] == got["messages"]

    status, refused = await inspector.call("search", "query=x", "limit=0")
    assert status == TOOL_IS_ERROR_EXIT and "limit" in refused["error"]

    assert await inspector.ok("delete_conversation", f"conversation_id={cid}") == {"deleted": True}
    status, gone = await inspector.call("get_conversation", f"conversation_id={cid}")
    assert status == TOOL_IS_ERROR_EXIT and gone == {"error": "Conversation not found"}
