"""Load scenarios: agent fleets over MCP (Streamable HTTP, JSON-RPC tools/call) and platform
teams over REST. Run headless through `run.py`, or directly:

  MEMORY_API_KEY=cmk_... locust -f benchmarks/locust/locustfile.py --headless \\
      --host http://127.0.0.1:8080 -u 20 -r 5 -t 60s AgentUser
"""

from __future__ import annotations

import itertools
import os
import random
from pathlib import Path
from typing import Any

from locust import HttpUser, between, task

WORDS = [
    "flight",
    "hotel",
    "invoice",
    "deploy",
    "budget",
    "garden",
    "recipe",
    "meeting",
    "doctor",
    "tax",
    "guitar",
    "marathon",
    "kubernetes",
    "postgres",
    "lisbon",
    "tokyo",
    "deadline",
    "insurance",
    "birthday",
    "laptop",
    "refund",
    "playlist",
]
_ids = itertools.count()


def api_key() -> str:
    key = os.environ.get("MEMORY_API_KEY")
    if key:
        return key
    return (Path(os.environ.get("MEMORY_DATA_DIR", "var")) / "dev-api-key").read_text().strip()


def sentence(n: int = 12) -> str:
    return " ".join(random.choice(WORDS) for _ in range(n))


class AgentUser(HttpUser):
    """An agent: keeps its own conversations, appends turns, searches its history (MCP)."""

    wait_time = between(0.05, 0.2)

    def on_start(self) -> None:
        self.client.headers.update(
            {
                "Authorization": f"Bearer {api_key()}",
                "Accept": "application/json, text/event-stream",
            }
        )
        self.agent_id = f"agent-{next(_ids)}"
        self.conversations: list[str] = []
        self.new_conversation()

    def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any] | None:
        body = {
            "jsonrpc": "2.0",
            "id": next(_ids),
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments},
        }
        with self.client.post(
            "/mcp", json=body, name=f"mcp {tool}", catch_response=True
        ) as response:
            result = response.json().get("result") if response.status_code == 200 else None
            if result is None or result.get("isError"):
                response.failure(f"{response.status_code}: {response.text[:200]}")
                return None
            structured: dict[str, Any] = result["structuredContent"]
            return structured

    @task(1)
    def new_conversation(self) -> None:
        created = self.call(
            "create_conversation", {"agent_id": self.agent_id, "tags": [random.choice(WORDS)]}
        )
        if created:
            self.conversations.append(created["conversation_id"])

    @task(6)
    def append_turn(self) -> None:
        self.call(
            "append_messages",
            {
                "conversation_id": random.choice(self.conversations),
                "messages": [
                    {"role": "user", "content": sentence()},
                    {"role": "assistant", "content": sentence(30)},
                ],
            },
        )

    @task(3)
    def search_history(self) -> None:
        arguments: dict[str, Any] = {"query": sentence(6), "limit": 5}
        if random.random() < 0.5:
            arguments["conversation_id"] = random.choice(self.conversations)
        self.call("search", arguments)

    @task(1)
    def reread(self) -> None:
        self.call(
            "get_conversation",
            {"conversation_id": random.choice(self.conversations), "message_limit": 20},
        )


class PlatformUser(HttpUser):
    """A platform team's tooling over REST: list, read, search, correct."""

    wait_time = between(0.1, 0.4)

    def on_start(self) -> None:
        self.client.headers.update({"Authorization": f"Bearer {api_key()}"})
        self.known: list[str] = []

    @task(3)
    def list_conversations(self) -> None:
        r = self.client.get(
            "/api/v1/conversations",
            params={"limit": 20, "sort": random.choice(["updated_at", "message_count"])},
            name="GET /conversations",
        )
        if r.status_code == 200:
            self.known = [c["id"] for c in r.json()["conversations"]] or self.known

    @task(2)
    def get_conversation(self) -> None:
        if self.known:
            self.client.get(
                f"/api/v1/conversations/{random.choice(self.known)}",
                params={"message_limit": 50},
                name="GET /conversations/:id",
            )

    @task(3)
    def search(self) -> None:
        self.client.get(
            "/api/v1/search", params={"q": sentence(6), "limit": 10}, name="GET /search"
        )

    @task(1)
    def patch_message(self) -> None:
        if not self.known:
            return
        cid = random.choice(self.known)
        r = self.client.get(
            f"/api/v1/conversations/{cid}",
            params={"message_limit": 5},
            name="GET /conversations/:id",
        )
        messages = r.json().get("messages", []) if r.status_code == 200 else []
        if messages:
            self.client.patch(
                f"/api/v1/conversations/{cid}/messages/{messages[0]['id']}",
                json={"content": sentence()},
                name="PATCH /conversations/:id/messages/:id",
            )
