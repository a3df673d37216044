"""Tenant isolation as a property: random operations by two orgs over both interfaces, aimed at
their own and at each other's conversations. Neither org ever sees the other's ids, content,
counts or search results, and each org's view matches a model of what it wrote."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.api.harness import McpCaller, Service

WORDS = ["seat", "lisbon", "dentist", "friday", "café", "記憶", "budget", "rocket", "🙂 ok"]
TAGS = ["red", "green", "blue"]
AGENTS = ["agent-1", "agent-2"]
PROJECTS = ["p1", "p2"]
NOT_FOUND = "Conversation not found"


@dataclass
class Conversation:
    owner: str
    id: str
    title: str | None
    agent_id: str | None
    tags: list[str]
    metadata: dict[str, Any]
    messages: list[dict[str, str]] = field(default_factory=list)  # id, role, content
    deleted: bool = False


@dataclass
class Org:
    name: str
    marker: str
    rest: httpx.AsyncClient
    mcp: McpCaller
    default_id: str | None = None


@dataclass
class World:
    orgs: dict[str, Org]
    conversations: list[Conversation] = field(default_factory=list)
    counter: itertools.count[int] = field(default_factory=itertools.count)

    def own(self, org: str) -> list[Conversation]:
        return [c for c in self.conversations if c.owner == org and not c.deleted]

    def foreign_secrets(self, org: str) -> list[str]:
        """What `org` must never see: the other org's marker and ids."""
        other = next(o for name, o in self.orgs.items() if name != org)
        secrets = [other.marker]
        for c in self.conversations:
            if c.owner != org:
                secrets += [c.id, *(m["id"] for m in c.messages)]
        return secrets

    def content(self, org: str, words: list[str]) -> tuple[str, str]:
        token = f"{self.orgs[org].marker}w{next(self.counter)}"
        return token, " ".join([token, *words])


# Operations: (kind, org, interface, arguments). A `ref` (aim, index) picks one of the acting
# org's live conversations when aim < 7, else any conversation created so far, of either org,
# live or deleted.
refs = st.tuples(st.integers(0, 9), st.integers(0, 50))
org_names = st.sampled_from(["a", "b"])
interfaces = st.sampled_from(["rest", "mcp"])
words = st.lists(st.sampled_from(WORDS), max_size=3)
searches = st.tuples(
    st.just("search"),
    org_names,
    interfaces,
    st.fixed_dictionaries(
        {
            "ref": st.one_of(st.none(), refs),  # conversation_id filter
            "query_ref": refs,  # whose words to search for: either org's
            "tags": st.one_of(st.just([]), st.just([]), st.tuples(st.sampled_from(TAGS)).map(list)),
            "project": st.one_of(st.none(), st.none(), st.sampled_from(PROJECTS)),
        }
    ),
)
_by_kind = [
    st.tuples(
        st.just("create"),
        org_names,
        interfaces,
        st.fixed_dictionaries(
            {
                "title": st.one_of(st.none(), st.sampled_from(WORDS)),
                "agent_id": st.one_of(st.none(), st.sampled_from(AGENTS)),
                "tags": st.lists(st.sampled_from(TAGS), max_size=3),
                "project": st.one_of(st.none(), st.sampled_from(PROJECTS)),
            }
        ),
    ),
    st.tuples(
        st.just("append"),
        org_names,
        interfaces,
        st.fixed_dictionaries(
            {
                "ref": st.one_of(refs, refs, refs, st.none()),  # None: REST default memory
                "messages": st.lists(
                    st.tuples(st.sampled_from(["user", "assistant", "tool"]), words),
                    min_size=1,
                    max_size=4,
                ),
            }
        ),
    ),
    st.tuples(st.just("get"), org_names, interfaces, st.fixed_dictionaries({"ref": refs})),
    st.tuples(
        st.just("list"),
        org_names,
        interfaces,
        st.fixed_dictionaries(
            {
                "agent_id": st.one_of(st.none(), st.sampled_from(AGENTS)),
                "tags": st.lists(st.sampled_from(TAGS), max_size=2),
                "sort": st.sampled_from(["created_at", "updated_at", "message_count"]),
                "order": st.sampled_from(["asc", "desc"]),
            }
        ),
    ),
    searches,
    st.tuples(
        st.just("patch"),
        org_names,
        st.just("rest"),
        st.fixed_dictionaries({"ref": refs, "index": st.integers(0, 10), "words": words}),
    ),
    st.tuples(st.just("delete"), org_names, interfaces, st.fixed_dictionaries({"ref": refs})),
]
# Uniform over kinds, with searches and appends twice as likely.
operations = st.sampled_from([0, 1, 1, 2, 3, 4, 4, 5, 6]).flatmap(lambda i: _by_kind[i])


def _leaks(world: World, org: str, payload: Any) -> None:
    text = json.dumps(payload, ensure_ascii=False)
    for secret in world.foreign_secrets(org):
        assert secret not in text, (org, secret, text[:500])


async def _call(org: Org, interface: str, tool: str, **args: Any) -> tuple[bool, dict[str, Any]]:
    """(ok, payload) from either interface; REST errors become {"error": text}."""
    if interface == "mcp":
        is_error, payload = await org.mcp.call(tool, **args)
        return not is_error, payload
    http = org.rest
    if tool == "create_conversation":
        r = await http.post("/api/v1/conversations", json=args)
    elif tool == "append_messages":
        r = await http.post("/api/v1/messages", json=args)
    elif tool == "get_conversation":
        r = await http.get(f"/api/v1/conversations/{args['conversation_id']}?message_limit=500")
    elif tool == "delete_conversation":
        r = await http.delete(f"/api/v1/conversations/{args['conversation_id']}")
    elif tool == "patch":
        cid, mid = args["conversation_id"], args["message_id"]
        r = await http.patch(
            f"/api/v1/conversations/{cid}/messages/{mid}", json={"content": args["content"]}
        )
    else:
        params = {k: ",".join(v) if isinstance(v, list) else v for k, v in args.items()}
        path = "/api/v1/search" if tool == "search" else "/api/v1/conversations"
        if tool == "search":
            params["q"] = params.pop("query")
        r = await http.get(path, params=params)
    payload = r.json()
    if r.status_code >= 400:
        assert r.status_code in (400, 404), (r.status_code, payload)
        assert set(payload) == {"error", "code"}
        return False, {"error": payload["error"]}
    return True, payload


def _check_conversation(model: Conversation, got: dict[str, Any]) -> None:
    conversation = got["conversation"]
    assert conversation["id"] == model.id
    assert conversation["title"] == model.title
    assert conversation["agent_id"] == model.agent_id
    assert conversation["tags"] == model.tags
    assert conversation["metadata"] == model.metadata
    assert conversation["message_count"] == len(model.messages)
    assert [(m["id"], m["role"], m["content"]) for m in got["messages"]] == [
        (m["id"], m["role"], m["content"]) for m in model.messages
    ]
    assert [m["sequence"] for m in got["messages"]] == list(range(1, len(model.messages) + 1))


def _resolve(world: World, org: str, ref: tuple[int, int] | None) -> Conversation | None:
    if ref is None:
        return None
    aim, index = ref
    pool = world.own(org) if aim < 7 and world.own(org) else world.conversations
    return pool[index % len(pool)] if pool else None


async def _apply(world: World, operation: tuple[str, str, str, dict[str, Any]]) -> None:
    kind, name, interface, args = operation
    org = world.orgs[name]
    target = _resolve(world, name, args.get("ref"))
    reachable = target is not None and target.owner == name and not target.deleted
    missing_id = target.id if target is not None else f"conv_{uuid.uuid4().hex[:16]}"

    if kind == "create":
        tags = list(dict.fromkeys(args["tags"]))
        metadata = {"project": args["project"]} if args["project"] else {}
        fields = {"title": args["title"], "agent_id": args["agent_id"], "tags": tags}
        ok, payload = await _call(
            org, interface, "create_conversation", **fields, metadata=metadata
        )
        assert ok, payload
        world.conversations.append(
            Conversation(name, payload["conversation_id"], **fields, metadata=metadata)
        )

    elif kind == "append":
        messages = []
        for role, chosen in args["messages"]:
            messages.append({"role": role, "content": world.content(name, chosen)[1]})
        if args["ref"] is None and interface == "rest":  # the org's default memory
            ok, payload = await _call(org, "rest", "append_messages", messages=messages)
            assert ok, payload
            if org.default_id is None:
                org.default_id = payload["conversation_id"]
                default = Conversation(
                    name, org.default_id, "Default memory", None, [], {"default": True}
                )
                world.conversations.append(default)
            assert payload["conversation_id"] == org.default_id
            target, reachable = next(c for c in world.conversations if c.id == org.default_id), True
        else:
            ok, payload = await _call(
                org, interface, "append_messages", conversation_id=missing_id, messages=messages
            )
            assert ok == reachable, payload
        if reachable:
            assert target is not None and payload["appended"] == len(messages)
            for message_id, message in zip(payload["message_ids"], messages, strict=True):
                target.messages.append({"id": message_id, **message})
        else:
            assert payload == {"error": NOT_FOUND}

    elif kind == "get":
        ok, payload = await _call(org, interface, "get_conversation", conversation_id=missing_id)
        assert ok == reachable, payload
        if reachable:
            assert target is not None
            _check_conversation(target, payload)
        else:
            assert payload == {"error": NOT_FOUND}

    elif kind == "list":
        filters = {k: v for k, v in args.items() if v}
        ok, payload = await _call(org, interface, "list_conversations", limit=100, **filters)
        assert ok, payload
        expected = {
            c.id
            for c in world.own(name)
            if set(args["tags"]) <= set(c.tags)
            and (args["agent_id"] is None or c.agent_id == args["agent_id"])
        }
        ids = [c["id"] for c in payload["conversations"]]
        assert len(ids) == len(set(ids)) and set(ids) == expected
        assert payload["total"] == len(expected)
        if args["sort"] in ("message_count", "updated_at"):
            keys = [c[args["sort"]] for c in payload["conversations"]]
            assert keys == sorted(keys, reverse=args["order"] == "desc")
        by_id = {c.id: c for c in world.conversations}
        for summary in payload["conversations"]:
            assert summary["message_count"] == len(by_id[summary["id"]].messages)

    elif kind == "search":
        source = _resolve(world, name, args["query_ref"])
        messages = source.messages if source is not None else []
        query = messages[len(messages) // 2]["content"] if messages else "seat budget"
        filters: dict[str, Any] = {"query": query, "limit": 50}
        if args["tags"]:
            filters["tags"] = args["tags"]
        if args["ref"] is not None:
            filters["conversation_id"] = missing_id
        if args["project"] and interface == "rest":
            filters["project"] = args["project"]
        ok, payload = await _call(org, interface, "search", **filters)
        if args["ref"] is not None and not reachable:
            assert payload == {"error": NOT_FOUND}
            return
        assert ok, payload
        allowed = {
            c.id
            for c in world.own(name)
            if set(args["tags"]) <= set(c.tags)
            and ("project" not in filters or c.metadata.get("project") == filters["project"])
            and ("conversation_id" not in filters or c.id == filters["conversation_id"])
        }
        hits = payload["results"]
        assert payload["total"] == len(hits)
        assert {h["conversation_id"] for h in hits} <= allowed, (hits, allowed)
        if (
            "conversation_id" in filters
            and target is not None
            and target.messages
            and (set(args["tags"]) <= set(target.tags) and "project" not in filters)
        ):  # all windows of a small conversation come back: every message is findable
            text = "\n".join(h["chunk_text"] for h in hits)
            for message in target.messages:
                assert f"[{message['role']}]: {message['content']}" in text

    elif kind == "patch":
        messages = target.messages if target is not None else []
        message_id = (
            messages[args["index"] % len(messages)]["id"] if messages else f"msg_{uuid.uuid4().hex}"
        )
        content = world.content(name, args["words"])[1]
        ok, payload = await _call(
            org, "rest", "patch", conversation_id=missing_id, message_id=message_id, content=content
        )
        if reachable and messages:
            assert ok, payload
            assert payload["message"]["id"] == message_id
            assert payload["message"]["content"] == content
            next(m for m in messages if m["id"] == message_id)["content"] = content
        else:
            assert not ok
            assert payload["error"] in (NOT_FOUND, "Message not found")
            if not reachable:
                assert payload["error"] == NOT_FOUND

    elif kind == "delete":
        ok, payload = await _call(org, interface, "delete_conversation", conversation_id=missing_id)
        assert ok == reachable, payload
        if reachable:
            assert target is not None and payload == {"deleted": True}
            target.deleted = True
            if target.id == org.default_id:
                org.default_id = None
        else:
            assert payload == {"error": NOT_FOUND}

    _leaks(world, name, payload)


async def _final_views_match(world: World) -> None:
    for name, org in world.orgs.items():
        for interface in ("rest", "mcp"):
            ok, listed = await _call(org, interface, "list_conversations", limit=100)
            assert ok and listed["total"] == len(world.own(name))
            assert {c["id"] for c in listed["conversations"]} == {c.id for c in world.own(name)}
            _leaks(world, name, listed)
        for conversation in world.own(name):
            ok, got = await _call(org, "mcp", "get_conversation", conversation_id=conversation.id)
            assert ok
            _check_conversation(conversation, got)


@asynccontextmanager
async def _two_orgs(service: Service) -> AsyncIterator[World]:
    async with AsyncExitStack() as stack:
        orgs = {}
        for name in ("a", "b"):
            _, key = await service.org_with_key()
            rest = await stack.enter_async_context(service.rest(key))
            mcp = await stack.enter_async_context(service.mcp(key))
            orgs[name] = Org(name, f"{name}{uuid.uuid4().hex[:10]}", rest, mcp)
        yield World(orgs)


@settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    # Each example runs dozens of requests; a failure reports its sequence unshrunk.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(sequence=st.lists(operations, min_size=8, max_size=24))
async def test_two_orgs_never_observe_each_other(
    service: Service, sequence: list[tuple[str, str, str, dict[str, Any]]]
) -> None:
    """One running service for all examples; fresh orgs for each."""
    preamble = [
        op
        for org, interface in (("a", "rest"), ("b", "mcp"))
        for op in [
            (
                "create",
                org,
                interface,
                {"title": None, "agent_id": None, "tags": [], "project": None},
            ),
            ("append", org, interface, {"ref": (0, 0), "messages": [("user", ["seat"])] * 2}),
        ]
    ]
    async with _two_orgs(service) as world:
        for operation in [*preamble, *sequence]:
            await _apply(world, operation)
        await _final_views_match(world)
