"""memctl: administer organizations and API keys, migrate, and run the whole stack locally."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import urllib.parse
from typing import NoReturn

import asyncpg
from pydantic import ValidationError

from api_service import auth, devstack
from api_service.cli_support import CliError, database, on_database
from api_service.core.errors import ServiceError
from api_service.core.ids import new_id
from api_service.limits import PlanLimits, month_start, utc_now
from api_service.settings import ApiSettings
from api_service.store import admin
from api_service.store.db import Conn
from api_service.store.migrate import migrate_url

DEFAULT_PLAN = "default"  # `plan set --plan default`: the org goes back to the default limits


async def _org(conn: Conn, name: str) -> str:
    org = await admin.org_by_name(conn, name)
    if org is None:
        raise CliError(f"no organization named {name!r}; create it with: memctl org create {name}")
    return org.org_id


def cmd_migrate(settings: ApiSettings, args: argparse.Namespace) -> None:
    with database(settings) as url:
        applied = asyncio.run(migrate_url(url))
    print("applied: " + ", ".join(applied) if applied else "schema is up to date")


def cmd_recount(settings: ApiSettings, args: argparse.Namespace) -> None:
    async def work(conn: Conn) -> None:
        changed = await admin.recount_totals(conn)
        print(f"recounted every organization's totals; {changed} of them had drifted")

    on_database(settings, work)


def cmd_org_create(settings: ApiSettings, args: argparse.Namespace) -> None:
    async def work(conn: Conn) -> None:
        if await admin.org_by_name(conn, args.name) is not None:
            raise CliError(f"organization {args.name!r} already exists")
        org = await admin.create_org(conn, new_id("org"), args.name, None)
        print(f"created organization {org.name} ({org.org_id})")

    on_database(settings, work)


def cmd_org_set(settings: ApiSettings, args: argparse.Namespace) -> None:
    async def work(conn: Conn) -> None:
        if not await admin.set_redact_pii(conn, args.name, args.redact_pii == "on"):
            raise CliError(f"no organization named {args.name!r}")
        print(f"{args.name}: redaction of emails and phone numbers {args.redact_pii}")

    on_database(settings, work)


def cmd_org_delete(settings: ApiSettings, args: argparse.Namespace) -> None:
    if args.confirm != args.name:
        raise CliError(
            f"deleting {args.name!r} removes all its data for good; to go ahead, repeat its "
            f"name: memctl org delete {args.name} --confirm {args.name}"
        )

    async def work(conn: Conn) -> None:
        deleted = await admin.delete_org(conn, args.name)
        if deleted is None:
            raise CliError(f"no organization named {args.name!r}")
        print(
            f"deleted organization {args.name} ({deleted.org_id}): {deleted.conversations} "
            f"conversations, {deleted.messages} messages, its keys and usage; the index "
            "shards drop its vectors as the indexer works through the outbox"
        )

    on_database(settings, work)


def cmd_plan_create(settings: ApiSettings, args: argparse.Namespace) -> None:
    if args.name == DEFAULT_PLAN:
        raise CliError(
            f"{DEFAULT_PLAN!r} names the limits of orgs without a plan (MEMORY_DEFAULT_PLAN__*, "
            "`python -m api_service --help`); give the plan another name"
        )

    async def work(conn: Conn) -> None:
        plan = await admin.upsert_plan(
            conn,
            args.name,
            monthly_requests=args.requests,
            storage_bytes=args.storage_bytes,
            conversations=args.conversations,
            messages=args.messages,
        )
        print(
            f"plan {args.name}: {plan.monthly_requests} requests/month, {plan.storage_bytes} "
            f"bytes, {plan.conversations} conversations, {plan.messages} messages"
        )

    on_database(settings, work)


def cmd_plan_set(settings: ApiSettings, args: argparse.Namespace) -> None:
    plan = None if args.plan == DEFAULT_PLAN else args.plan

    async def work(conn: Conn) -> None:
        if plan is not None and not await admin.plan_exists(conn, plan):
            raise CliError(f"no plan named {plan!r}; create it with: memctl plan create {plan}")
        if not await admin.set_org_plan(conn, args.org, plan):
            raise CliError(f"no organization named {args.org!r}")
        print(f"{args.org} is on plan {args.plan}")

    on_database(settings, work)


def cmd_usage(settings: ApiSettings, args: argparse.Namespace) -> None:
    async def work(conn: Conn) -> None:
        org = await admin.org_by_name(conn, args.org)
        if org is None:
            raise CliError(f"no organization named {args.org!r}")
        now = utc_now()
        requests = await conn.fetchval(
            "SELECT requests FROM usage WHERE org_id = $1 AND month = $2",
            org.org_id,
            month_start(now),
        )
        plan = await admin.plan_of(conn, org.org_id) or settings.default_plan
        totals = await admin.org_totals(conn, org.org_id)
        print(f"organization:  {org.name} ({org.org_id}), plan {org.plan or 'default'}")
        print(f"month:         {now:%Y-%m} (UTC)")
        print(f"requests:      {requests or 0} of {plan.monthly_requests}")
        print(f"storage bytes: {totals.storage_bytes} of {plan.storage_bytes}")
        print(f"conversations: {totals.conversations} of {plan.conversations}")
        print(f"messages:      {totals.messages} of {plan.messages}")

    on_database(settings, work)


def cmd_key_create(settings: ApiSettings, args: argparse.Namespace) -> None:
    async def work(conn: Conn) -> None:
        org_id = await _org(conn, args.org)
        secret, key = await auth.issue_key(
            conn, org_id, auth.parse_scopes(args.scopes), args.expires_in
        )
        expires = key.expires_at.isoformat() if key.expires_at else "never"
        print(f"key id:  {key.key_id}\nscopes:  {','.join(key.scopes)}\nexpires: {expires}")
        print(f"api key: {secret}\n(shown once: it is stored only as a hash)")

    on_database(settings, work)


def cmd_key_revoke(settings: ApiSettings, args: argparse.Namespace) -> None:
    async def work(conn: Conn) -> None:
        key = await admin.revoke_key(conn, args.key_id)
        if key is None:
            raise CliError(f"no key with id {args.key_id!r}; see: memctl key list --org NAME")
        print(f"revoked {key.key_id}")

    on_database(settings, work)


def cmd_key_list(settings: ApiSettings, args: argparse.Namespace) -> None:
    async def work(conn: Conn) -> None:
        keys = await admin.list_keys(conn, await _org(conn, args.org))
        print(f"{'KEY ID':<22} {'PREFIX':<12} {'SCOPES':<11} {'EXPIRES':<26} STATUS")
        now = time.time()
        for k in keys:
            status = (
                "revoked"
                if k.revoked_at
                else ("expired" if k.expires_at and k.expires_at.timestamp() <= now else "active")
            )
            expires = k.expires_at.isoformat(timespec="seconds") if k.expires_at else "never"
            print(f"{k.key_id:<22} {k.prefix:<12} {','.join(k.scopes):<11} {expires:<26} {status}")

    on_database(settings, work)


MAX_KEY_DAYS = 36_500  # a key's longest life, about a century


def _days(text: str) -> float:
    """--expires-in: a positive, finite number of days, at most MAX_KEY_DAYS."""
    try:
        days = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of days") from None
    if not 0 < days <= MAX_KEY_DAYS:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"give more than 0 and at most {MAX_KEY_DAYS} days")
    return days


def _limit(text: str) -> int:
    """A plan's limit: a whole number, 0 or more, that PostgreSQL's bigint holds."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"give 0 or more, below 2**63, not {value}")
    return value


def _command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    summary: str,
    more: str = "",
) -> argparse.ArgumentParser:
    """A subcommand whose own --help says what it does: `summary` in the parent's list, and
    with `more` at the top of its --help."""
    description = f"{summary[:1].upper()}{summary[1:]}. {more}".strip()
    return sub.add_parser(name, help=summary, description=description)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memctl",
        description=(
            "Administer the conversation memory service and run it locally. Commands use "
            "DATABASE_URL (or MEMORY_DATABASE_URL, which wins) when set, otherwise the embedded "
            "PostgreSQL under MEMORY_DATA_DIR "
            "(default ./var)."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = _command(
        sub,
        "up",
        "run api, embed and index services on loopback",
        "Starts PostgreSQL embedded under MEMORY_DATA_DIR (default ./var), or runs on "
        "DATABASE_URL with --use-database-url (refused without it). On first start it creates "
        "the organization 'dev' with a read+write key, kept in MEMORY_DATA_DIR/dev-api-key, "
        "and prints the base URL, the key and an MCP client configuration. Ctrl-C stops every "
        "service (and the embedded PostgreSQL).",
    )
    up.add_argument("--port", type=int, default=8080, help="HTTP port of the API (default 8080)")
    up.add_argument("--embed-port", type=int, default=50051, help="embed_service gRPC port")
    up.add_argument("--index-port", type=int, default=50061, help="index_service gRPC port")
    up.add_argument(
        "--embedder",
        choices=["transformer", "hashing"],
        default="transformer",
        help="embedding backend: the real model (default) or the small "
        "deterministic one for trying things out quickly",
    )
    up.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds to wait for each service to become ready",
    )
    up.add_argument(
        "--use-database-url",
        action="store_true",
        help="run on the database at DATABASE_URL (a development one: it is migrated, gets "
        "the 'dev' organization, and its outbox is indexed here)",
    )
    up.set_defaults(run=devstack.cmd_up)

    mig = _command(
        sub,
        "migrate",
        "apply pending schema migrations",
        "Applies, in order, the migrations the database has not had; several replicas may run "
        "it at once. The API also migrates when it starts.",
    )
    mig.set_defaults(run=cmd_migrate)
    recount = _command(
        sub,
        "recount",
        "recount each organization's totals from its conversations",
        "Sets each organization's stored bytes, conversations and messages, as its plan's "
        "limits count them, to its conversations' sums. Run it once a rolling update that "
        "adds a counted limit is done: the previous release's pods do not count it meanwhile. "
        "Writes wait while it runs.",
    )
    recount.set_defaults(run=cmd_recount)

    org = _command(sub, "org", "manage organizations").add_subparsers(
        dest="org_command", required=True, metavar="ACTION"
    )
    org_create = _command(
        org, "create", "create an organization", "Then give it a key: memctl key create --org NAME"
    )
    org_create.add_argument("name", help="unique organization name")
    org_create.set_defaults(run=cmd_org_create)
    org_set = _command(org, "set", "change an organization's settings")
    org_set.add_argument("name", help="organization name")
    org_set.add_argument(
        "--redact-pii",
        choices=["on", "off"],
        required=True,
        help="also redact emails and phone numbers (secrets always are)",
    )
    org_set.set_defaults(run=cmd_org_set)
    org_delete = _command(
        org,
        "delete",
        "delete an organization and all its data",
        "Deletes its conversations, messages, chunks and vectors, keys, usage and term "
        "statistics at once, for good; its keys stop working. The index shards drop its "
        "vectors as the API's indexer works through the outbox.",
    )
    org_delete.add_argument("name", help="organization name")
    org_delete.add_argument(
        "--confirm", metavar="NAME", help="the organization's name again, to confirm"
    )
    org_delete.set_defaults(run=cmd_org_delete)

    plan = _command(sub, "plan", "manage plans (limits)").add_subparsers(
        dest="plan_command", required=True, metavar="ACTION"
    )
    plan_create = _command(
        plan,
        "create",
        "create or update a plan",
        "Put an organization on it with: memctl plan set --org ORG --plan NAME",
    )
    plan_create.add_argument("name", help="plan name")
    plan_create.add_argument(
        "--requests", type=_limit, required=True, help="API requests per UTC month (429 past it)"
    )
    plan_create.add_argument(
        "--storage-bytes",
        type=_limit,
        required=True,
        help="stored message content and metadata (402 past it)",
    )
    plan_create.add_argument(
        "--conversations", type=_limit, required=True, help="conversations (402 past it)"
    )
    plan_create.add_argument(
        "--messages",
        type=_limit,
        help="messages in all its conversations (402 past it; a new plan gets "
        f"{PlanLimits().messages}, an existing one keeps its own)",
    )
    plan_create.set_defaults(run=cmd_plan_create)
    plan_set = _command(plan, "set", "put an organization on a plan")
    plan_set.add_argument("--org", required=True, help="organization name")
    plan_set.add_argument(
        "--plan", required=True, help="plan name, or 'default' for the configured default limits"
    )
    plan_set.set_defaults(run=cmd_plan_set)

    usage = _command(sub, "usage", "an organization's use of its plan this month")
    usage.add_argument("--org", required=True, help="organization name")
    usage.set_defaults(run=cmd_usage)

    key = _command(sub, "key", "manage API keys").add_subparsers(
        dest="key_command", required=True, metavar="ACTION"
    )
    key_create = _command(
        key,
        "create",
        "create a key (printed once)",
        "The key is printed once and stored only as its SHA-256 digest: keep it now. Clients "
        "send it as 'Authorization: Bearer KEY' to REST and MCP alike.",
    )
    key_create.add_argument("--org", required=True, help="organization name")
    key_create.add_argument(
        "--scopes", default="read,write", help="comma-separated: read, write (default read,write)"
    )
    key_create.add_argument(
        "--expires-in",
        type=_days,
        metavar="DAYS",
        help=f"expire after DAYS days, at most {MAX_KEY_DAYS} (default: never)",
    )
    key_create.set_defaults(run=cmd_key_create)
    key_revoke = _command(
        key,
        "revoke",
        "revoke a key by its id",
        "Requests with it get 403 from the next one on (each api process is told through "
        "PostgreSQL).",
    )
    key_revoke.add_argument("key_id", help="key id, as shown by 'memctl key list'")
    key_revoke.set_defaults(run=cmd_key_revoke)
    key_list = _command(key, "list", "list an organization's keys")
    key_list.add_argument("--org", required=True, help="organization name")
    key_list.set_defaults(run=cmd_key_list)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        settings = ApiSettings()
        _check_database_url(settings.database_url)
        args.run(settings, args)
    except ValidationError as exc:  # the values are left out: a URL may hold a password
        fields = ", ".join(  # MEMORY_LIMITS__CONTENT_CHARS for a nested one
            "MEMORY_" + "__".join(str(part).upper() for part in e["loc"] if isinstance(part, str))
            for e in exc.errors()
            if e["loc"]
        )
        _fail(f"invalid setting: {fields} (`python -m api_service --help` lists the settings)")
    except (CliError, ServiceError) as exc:
        _fail(str(exc))
    except (OSError, asyncpg.PostgresError) as exc:
        _fail(f"database error: {exc}")
    except KeyboardInterrupt:
        raise SystemExit(130) from None


def _check_database_url(url: str | None) -> None:
    """A DATABASE_URL the driver can read; its text is not shown, as it may hold a password."""
    if url is None:
        return
    try:
        urllib.parse.urlsplit(url).port  # noqa: B018 (raises on a port that is no number)
    except ValueError:
        raise CliError(
            "DATABASE_URL is malformed: its host part does not parse (percent-encode "
            "characters such as / # ? @ : in the user name and password)"
        ) from None


def _fail(message: str) -> NoReturn:
    print(f"memctl: {message}", file=sys.stderr)
    raise SystemExit(1)


if __name__ == "__main__":
    main()
