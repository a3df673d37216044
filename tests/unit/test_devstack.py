"""The benchmarks' stack in a child process: a fresh start never empties a folder that a running
PostgreSQL server uses."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from api_service.cli_support import CliError
from api_service.devstack import _postgres_running, stack_in_subprocess


def _pgdata(folder: Path, pid: int) -> Path:
    pgdata = folder / "postgres"
    pgdata.mkdir(parents=True)
    (pgdata / "postmaster.pid").write_text(f"{pid}\n{pgdata}\n")
    return pgdata


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_server_is_running_while_its_pid_is_alive(tmp_path: Path) -> None:
    assert _postgres_running(tmp_path / "postgres") is None  # no file
    assert _postgres_running(_pgdata(tmp_path / "alive", os.getpid())) == os.getpid()
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert _postgres_running(_pgdata(tmp_path / "crashed", int(ended.stdout))) is None


def test_a_fresh_stack_leaves_a_running_servers_folder_alone(tmp_path: Path) -> None:
    pgdata = _pgdata(tmp_path, os.getpid())
    with (
        pytest.raises(CliError, match="choose another data folder"),
        stack_in_subprocess(tmp_path, _free_port(), "hashing", fresh=True),
    ):
        pass
    assert (pgdata / "postmaster.pid").exists()
