"""The committed contracts match the code: OpenAPI document, MCP tool list, gRPC stubs, schema."""

import subprocess
import sys
from pathlib import Path

from jsonschema import Draft202012Validator

from api_service.contract import (
    MCP_TOOLS_FILE,
    OPENAPI_FILE,
    dumps,
    live_mcp_tools,
    live_openapi,
)
from api_service.mcp_server import TOOL_SCOPES

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = "run: python -m api_service.contract"


def test_openapi_document_is_current() -> None:
    assert OPENAPI_FILE.read_text() == dumps(live_openapi()), REGENERATE


async def test_mcp_tool_list_is_current() -> None:
    assert MCP_TOOLS_FILE.read_text() == dumps(await live_mcp_tools()), REGENERATE


async def test_the_six_tools_take_the_contract_parameters() -> None:
    tools = {t["name"]: t["inputSchema"] for t in await live_mcp_tools()}
    expected = {
        "create_conversation": ({"title", "agent_id", "tags", "metadata"}, set()),
        "append_messages": ({"conversation_id", "messages"}, {"conversation_id", "messages"}),
        # `project` beyond the contract's table: the design's MCP search filters by it too.
        "search": (
            {"query", "limit", "conversation_id", "tags", "snippet_chars", "project"},
            {"query"},
        ),
        "get_conversation": (
            {"conversation_id", "message_limit", "message_offset"},
            {"conversation_id"},
        ),
        "list_conversations": ({"limit", "offset", "agent_id", "tags", "sort", "order"}, set()),
        "delete_conversation": ({"conversation_id"}, {"conversation_id"}),
    }
    assert set(tools) == set(expected)
    assert set(TOOL_SCOPES) == set(expected)  # each tool's scope is checked before its input
    for name, (params, required) in expected.items():
        assert set(tools[name]["properties"]) == params, name
        assert set(tools[name].get("required", [])) == required, name
    search = tools["search"]["properties"]
    assert (search["limit"]["default"], search["limit"]["minimum"], search["limit"]["maximum"]) == (
        5,
        1,
        50,
    )
    assert (search["snippet_chars"]["default"], search["snippet_chars"]["maximum"]) == (1500, 5000)
    listing = tools["list_conversations"]["properties"]
    assert listing["sort"]["default"] == "updated_at" and listing["order"]["default"] == "desc"
    assert (listing["limit"]["default"], listing["limit"]["maximum"]) == (20, 100)
    get = tools["get_conversation"]["properties"]
    assert (get["message_limit"]["default"], get["message_limit"]["maximum"]) == (100, 500)


async def test_every_tool_default_fits_its_own_schema() -> None:
    """A client that fills in defaults before validating its call must not reject its own
    call: each declared default is valid against the schema that declares it."""
    for tool in await live_mcp_tools():
        definitions = tool["inputSchema"].get("$defs", {})
        for name, schema in tool["inputSchema"]["properties"].items():
            if "default" in schema:
                validator = Draft202012Validator({**schema, "$defs": definitions})
                errors = list(validator.iter_errors(schema["default"]))
                assert not errors, f"{tool['name']}.{name}: {errors[0].message}"


def test_openapi_has_the_seven_operations_and_usage() -> None:
    paths = live_openapi()["paths"]
    operations = {(method.upper(), path) for path, ops in paths.items() for method in ops}
    assert operations == {
        ("POST", "/api/v1/conversations"),
        ("GET", "/api/v1/conversations"),
        ("GET", "/api/v1/conversations/{conversation_id}"),
        ("DELETE", "/api/v1/conversations/{conversation_id}"),
        ("POST", "/api/v1/messages"),
        ("PATCH", "/api/v1/conversations/{conversation_id}/messages/{message_id}"),
        ("GET", "/api/v1/search"),
        ("GET", "/api/v1/usage"),
    }


def test_generated_grpc_code_is_current(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    committed = ROOT / "memory_proto"
    generated = sorted(p.name for p in tmp_path.iterdir())
    assert generated == sorted(p.name for p in committed.iterdir() if p.is_file()), (
        "run: python proto/generate.py"
    )
    for name in generated:
        assert (tmp_path / name).read_text() == (committed / name).read_text(), (
            f"memory_proto/{name} is stale; run: python proto/generate.py"
        )


def test_openapi_declares_the_errors_and_the_key_the_service_answers_with() -> None:
    """Validation errors are 400 (never FastAPI's 422), and every operation takes the key."""
    document = live_openapi()
    statuses = {
        status
        for operations in document["paths"].values()
        for operation in operations.values()
        for status in operation["responses"]
    }
    assert "422" not in statuses and {"400", "401", "403"} <= statuses
    assert "HTTPValidationError" not in document["components"]["schemas"]
    assert document["security"] == [{"apiKey": []}]
    scheme = document["components"]["securitySchemes"]["apiKey"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
