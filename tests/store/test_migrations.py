import asyncpg

from api_service.store.migrate import migrate, migration_files


async def test_migrations_apply_once_and_name_every_file(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        assert await migrate(conn) == []  # the template already holds every migration
        applied = [
            r["name"] for r in await conn.fetch("SELECT name FROM schema_migrations ORDER BY name")
        ]
        assert applied == [name for name, _ in migration_files()]
        assert applied[0] == "0001_initial.sql"
    finally:
        await conn.close()
