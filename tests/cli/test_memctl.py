"""memctl against a real database, as a user runs it (a subprocess per command)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import asyncpg
import grpc
import pytest

from api_service import auth, devstack
from api_service.core.errors import Forbidden
from api_service.store import lexical
from api_service.store.db import create_pool
from index_service.routing import routing_epoch
from memory_proto import index_pb2, index_pb2_grpc
from tests.api.harness import outbox_drained, running_service, say

# Every table that holds an organization's rows.
ORG_TABLES = (
    "orgs",
    "api_keys",
    "conversations",
    "messages",
    "chunks",
    "chunk_vectors",
    "usage",
    "lexical_stats",
    "lexeme_df",
)


def memctl(
    database_url: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """memctl run with `args` on `database_url`, `env` added to the environment."""
    env = {**os.environ, "DATABASE_URL": database_url, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "api_service.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_org_and_key_lifecycle(database_url: str) -> None:
    created = memctl(database_url, "org", "create", "acme")
    assert created.returncode == 0, created.stderr
    assert "created organization acme (org_" in created.stdout
    pii = memctl(database_url, "org", "set", "acme", "--redact-pii", "on")
    assert pii.returncode == 0 and "on" in pii.stdout, pii.stderr
    again = memctl(database_url, "org", "create", "acme")
    assert again.returncode == 1 and "already exists" in again.stderr

    issued = memctl(
        database_url, "key", "create", "--org", "acme", "--scopes", "read", "--expires-in", "30"
    )
    assert issued.returncode == 0, issued.stderr
    secret = re.search(r"api key: (cmk_\S+)", issued.stdout)
    key_id = re.search(r"key id:\s+(key_\S+)", issued.stdout)
    assert secret and key_id

    pool = await create_pool(database_url, 1, 2)
    try:
        principal = await auth.resolve(pool, auth.hash_key(secret.group(1)))
        assert principal.scopes == frozenset({"read"}) and principal.redact_pii
        stored = await pool.fetchval(
            "SELECT count(*) FROM api_keys WHERE key_hash = $1", auth.hash_key(secret.group(1))
        )
        assert stored == 1
        in_clear = await pool.fetchval(
            "SELECT count(*) FROM api_keys WHERE prefix = $1 OR key_id = $1", secret.group(1)
        )
        assert in_clear == 0

        listed = memctl(database_url, "key", "list", "--org", "acme")
        assert key_id.group(1) in listed.stdout and "active" in listed.stdout
        assert secret.group(1) not in listed.stdout

        revoked = memctl(database_url, "key", "revoke", key_id.group(1))
        assert revoked.returncode == 0 and "revoked" in revoked.stdout
        with pytest.raises(Forbidden):
            await auth.resolve(pool, auth.hash_key(secret.group(1)))
        assert "revoked" in memctl(database_url, "key", "list", "--org", "acme").stdout
    finally:
        await pool.close()


def test_clear_errors(database_url: str) -> None:
    missing = memctl(database_url, "key", "create", "--org", "nobody")
    assert missing.returncode == 1
    assert "memctl org create nobody" in missing.stderr
    bad_scope = memctl(database_url, "org", "create", "x")
    assert bad_scope.returncode == 0
    bad_scope = memctl(database_url, "key", "create", "--org", "x", "--scopes", "admin")
    assert bad_scope.returncode == 1 and "read, write" in bad_scope.stderr
    unknown = memctl(database_url, "key", "revoke", "key_unknown")
    assert unknown.returncode == 1 and "memctl key list" in unknown.stderr

    for days in ("-1", "0", "inf", "nan", "1e7", "soon"):
        never = memctl(database_url, "key", "create", "--org", "x", "--expires-in", days)
        assert never.returncode == 2 and "--expires-in" in never.stderr, days
        assert "Traceback" not in never.stderr


def test_a_malformed_database_url_is_named_without_its_password(database_url: str) -> None:
    for url, secret in (
        ("postgresql://app:s3cr/et@db/memory", "s3cr"),
        ("postgresql://app:x9q#v@db/memory", "x9q"),
    ):
        failed = memctl(url, "migrate")
        assert failed.returncode == 1 and "DATABASE_URL is malformed" in failed.stderr
        assert "Traceback" not in failed.stderr and secret not in failed.stderr


def test_a_bad_setting_is_named_without_its_value(database_url: str) -> None:
    failed = memctl(database_url, "migrate", env={"MEMORY_DB_POOL_MAX": "many-s3cret"})
    assert failed.returncode == 1 and "invalid setting: MEMORY_DB_POOL_MAX" in failed.stderr
    assert "python -m api_service --help" in failed.stderr
    assert "Traceback" not in failed.stderr and "s3cret" not in failed.stderr
    nested = memctl(database_url, "migrate", env={"MEMORY_LIMITS__CONTENT_CHARS": "lots"})
    assert "invalid setting: MEMORY_LIMITS__CONTENT_CHARS" in nested.stderr


async def test_org_delete_leaves_nothing_of_the_org(database_url: str) -> None:
    """Deleted with memctl: no row of the org is left in any table, its key is refused, and
    once the outbox drains no shard holds a vector of it. Another org is untouched."""
    async with running_service(database_url) as service:
        org_id, key = await service.org_with_key()
        _, other_key = await service.org_with_key()
        conn = await asyncpg.connect(database_url)
        try:
            name = await conn.fetchval("SELECT name FROM orgs WHERE org_id = $1", org_id)
            for http_key, words in ((key, "zanzibar codeword"), (other_key, "kept words")):
                async with service.rest(http_key) as http:
                    for _ in range(2):
                        cid = (await http.post("/api/v1/conversations", json={})).json()
                        # 2 x 750 messages: 500 chunks, an org with term statistics.
                        for part in range(3):
                            messages = [
                                {"role": "user", "content": f"{words} {part}.{n}"}
                                for n in range(250)
                            ]
                            r = await http.post(
                                "/api/v1/messages",
                                json={**cid, "messages": messages},
                            )
                            assert r.status_code == 200, r.text
                    assert (await say(http, cid["conversation_id"], words)).status_code == 200
            await outbox_drained(database_url)
            assert await lexical.keep_stats(conn, org_id)
            await conn.execute(
                "INSERT INTO usage (org_id, month, requests) "
                "VALUES ($1, date_trunc('month', now())::date, 1) ON CONFLICT DO NOTHING",
                org_id,
            )
            for table in ORG_TABLES:
                held = await conn.fetchval(
                    f"SELECT count(*) FROM {table} WHERE org_id = $1", org_id
                )
                assert held > 0, table

            unconfirmed = memctl(database_url, "org", "delete", name)
            assert unconfirmed.returncode == 1 and f"--confirm {name}" in unconfirmed.stderr
            deleted = memctl(database_url, "org", "delete", name, "--confirm", name)
            assert deleted.returncode == 0, deleted.stderr
            assert f"deleted organization {name} ({org_id}): 2 conversations" in deleted.stdout
            await outbox_drained(database_url)

            for table in ORG_TABLES:
                left = await conn.fetchval(
                    f"SELECT count(*) FROM {table} WHERE org_id = $1", org_id
                )
                assert left == 0, table
            async with service.rest(key) as http:
                assert (await http.get("/api/v1/conversations")).status_code == 401
            shards = service.settings.index_shards
            async with grpc.aio.insecure_channel(shards[0]) as channel:
                stats = await index_pb2_grpc.IndexServiceStub(channel).Stats(
                    index_pb2.StatsRequest(org_id=org_id, routing_epoch=routing_epoch(shards))
                )
            assert stats.vectors == 0
            async with service.rest(other_key) as http:
                found = (await http.get("/api/v1/search", params={"q": "kept words"})).json()
            assert found["total"] > 0
            gone = memctl(database_url, "org", "delete", name, "--confirm", name)
            assert gone.returncode == 1 and "no organization named" in gone.stderr
        finally:
            await conn.close()


def test_up_refuses_a_database_url_it_was_not_told_to_use(database_url: str) -> None:
    """A DATABASE_URL left in the shell (production's, say) would be migrated, given a dev
    org and key, and have its outbox indexed into a shard on this machine."""
    refused = memctl(database_url, "up", "--embedder", "hashing")
    assert refused.returncode == 1 and "--use-database-url" in refused.stderr
    assert "DATABASE_URL (or MEMORY_DATABASE_URL) is set" in refused.stderr
    assert database_url not in refused.stderr


def test_help_documents_every_command(database_url: str) -> None:
    top = memctl(database_url, "--help")
    for command in ("up", "migrate", "org", "key"):
        assert command in top.stdout
    up = memctl(database_url, "up", "--help")
    for text in ("--port", "--embedder", "--timeout", "Ctrl-C", "dev-api-key"):
        assert text in up.stdout
    # Each command's own --help says what it does, not only how it is called.
    for command in (["migrate"], ["org", "create"], ["key", "create"], ["usage"]):
        shown = memctl(database_url, *command, "--help").stdout
        description = shown.split("\n\n")[1]
        assert not description.startswith(("options:", "positional")), command
    assert "printed once" in memctl(database_url, "key", "create", "--help").stdout


def test_plans_and_usage(database_url: str) -> None:
    assert memctl(database_url, "org", "create", "beta").returncode == 0
    usage = memctl(database_url, "usage", "--org", "beta")
    assert usage.returncode == 0, usage.stderr
    assert "plan default" in usage.stdout and "requests:      0 of 1000000" in usage.stdout
    made = memctl(
        database_url,
        "plan",
        "create",
        "small",
        "--requests",
        "100",
        "--storage-bytes",
        "5000",
        "--conversations",
        "3",
        "--messages",
        "40",
    )
    assert made.returncode == 0, made.stderr
    moved = memctl(database_url, "plan", "set", "--org", "beta", "--plan", "small")
    assert moved.returncode == 0 and "small" in moved.stdout
    usage = memctl(database_url, "usage", "--org", "beta")
    assert "requests:      0 of 100" in usage.stdout
    assert "storage bytes: 0 of 5000" in usage.stdout
    assert "conversations: 0 of 3" in usage.stdout
    assert "messages:      0 of 40" in usage.stdout
    changed = memctl(
        database_url, "plan", "create", "small", "--requests", "200", "--storage-bytes", "5000",
        "--conversations", "3",
    )  # fmt: skip
    assert changed.returncode == 0, changed.stderr
    assert "200 requests/month" in changed.stdout and "40 messages" in changed.stdout
    negative = memctl(
        database_url, "plan", "create", "bad", "--requests", "-1", "--storage-bytes", "1",
        "--conversations", "1",
    )  # fmt: skip
    assert negative.returncode == 2 and "give 0 or more" in negative.stderr
    missing = memctl(database_url, "plan", "set", "--org", "beta", "--plan", "nope")
    assert missing.returncode == 1 and "memctl plan create nope" in missing.stderr
    # `--plan default` means the default limits: no plan may take that name.
    named_default = memctl(
        database_url, "plan", "create", "default", "--requests", "5", "--storage-bytes", "5",
        "--conversations", "1",
    )  # fmt: skip
    assert named_default.returncode == 1 and "give the plan another name" in named_default.stderr


async def test_recount_sets_each_org_s_totals_to_its_conversations(database_url: str) -> None:
    pool = await create_pool(database_url, 1, 1)
    try:
        await pool.execute(
            """INSERT INTO orgs (org_id, name, storage_bytes, conversation_count, message_count)
               VALUES ('org_drifted', 'drifted', 3, 9, -2), ('org_right', 'right', 0, 0, 0)"""
        )
        await pool.execute(
            """INSERT INTO conversations (org_id, conversation_id, storage_bytes, message_count)
               VALUES ('org_drifted', 'conv_1', 10, 2), ('org_drifted', 'conv_2', 5, 6)"""
        )
        recounted = memctl(database_url, "recount")
        assert recounted.returncode == 0, recounted.stderr
        assert "1 of them had drifted" in recounted.stdout
        totals = await pool.fetch(
            "SELECT org_id, storage_bytes, conversation_count, message_count FROM orgs "
            "WHERE org_id IN ('org_drifted', 'org_right') ORDER BY org_id"
        )
        assert [tuple(row) for row in totals] == [("org_drifted", 15, 2, 8), ("org_right", 0, 0, 0)]
    finally:
        await pool.close()


def test_the_dev_key_is_kept_private_and_replaced_once_revoked(
    database_url: str, tmp_path: Path
) -> None:
    key_file = tmp_path / "dev-api-key"
    key_file.write_text("")
    key_file.chmod(0o644)  # left readable by an earlier version
    first, created = devstack._dev_key(database_url, key_file)
    assert created and key_file.stat().st_mode & 0o777 == 0o600
    assert devstack._dev_key(database_url, key_file) == (first, False)
    key_id = re.search(r"(key_\S+)", memctl(database_url, "key", "list", "--org", "dev").stdout)
    assert key_id
    assert memctl(database_url, "key", "revoke", key_id.group(1)).returncode == 0
    second, created = devstack._dev_key(database_url, key_file)  # memctl up would show it
    assert created and second != first and key_file.read_text().strip() == second
