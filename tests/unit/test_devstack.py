"""memctl up and the benchmarks' stack in a child process: a fresh start never empties a folder
that a running PostgreSQL server uses, and a stack stopped by a signal stops its server."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from api_service import devstack
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


def _memctl_up(
    tmp_path: Path, preexec_fn: Callable[[], object], *, start_new_session: bool = False
) -> tuple[subprocess.Popen[bytes], Path]:
    """`memctl up` with the hashing embedder on free ports and the embedded PostgreSQL under
    `tmp_path`, its output in a log there; the process and the log's path."""
    ports = [str(_free_port()) for _ in range(3)]
    command = [sys.executable, "-m", "api_service.cli", "up", "--embedder", "hashing"]
    command += ["--port", ports[0], "--embed-port", ports[1], "--index-port", ports[2]]
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    log_path = tmp_path / "up.log"
    with log_path.open("w") as log:
        up = subprocess.Popen(
            command,
            env={**env, "MEMORY_DATA_DIR": str(tmp_path)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=start_new_session,
            preexec_fn=preexec_fn,
        )
    return up, log_path


@pytest.mark.parametrize(
    ("signum", "ignored"),
    [(signal.SIGTERM, False), (signal.SIGHUP, False), (signal.SIGHUP, True)],
    ids=["sigterm", "sighup", "sighup-under-nohup"],
)
def test_memctl_up_stopped_while_starting_stops_its_postgres(
    tmp_path: Path, signum: signal.Signals, ignored: bool
) -> None:
    """SIGTERM (kill) or SIGHUP (the terminal closed) before the services are up unwinds as
    Ctrl-C does: the embedded PostgreSQL does not outlive memctl. Started under nohup, it
    keeps SIGHUP ignored, and a SIGTERM stops it."""
    # Set either way: this test may itself run under nohup.
    up, log_path = _memctl_up(
        tmp_path,
        lambda: signal.signal(signum, signal.SIG_IGN if ignored else signal.SIG_DFL),
    )
    pgdata = tmp_path / "postgres"
    try:
        deadline = time.monotonic() + 120
        while "starting embed_service" not in log_path.read_text():
            assert up.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        assert _postgres_running(pgdata) is not None
        up.send_signal(signum)
        if ignored:
            time.sleep(2)
            assert up.poll() is None, log_path.read_text()
            up.send_signal(signal.SIGTERM)  # now started, or still starting
            assert up.wait(timeout=60) in (0, 130), log_path.read_text()
        else:
            assert up.wait(timeout=60) == 130, log_path.read_text()
        assert "Traceback" not in log_path.read_text()
        assert _postgres_running(pgdata) is None
    finally:
        if up.poll() is None:
            up.kill()
        left = _postgres_running(pgdata)
        if left is not None:
            os.kill(left, signal.SIGTERM)


def test_a_killed_benchmark_leaves_no_stack_behind(tmp_path: Path) -> None:
    """A process that started the stack in a child and is then killed (no `finally` runs):
    memctl stops its services and PostgreSQL, and the ports are free again."""
    port = _free_port()
    script = (
        "import sys, time; from pathlib import Path; "
        "from api_service.devstack import stack_in_subprocess\n"
        f"with stack_in_subprocess(Path({str(tmp_path)!r}), {port}, 'hashing'):\n"
        "    print('serving', flush=True); time.sleep(600)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    bench = subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert bench.stdout is not None
        assert "serving\n" in iter(bench.stdout.readline, "")  # after the stack's progress
        assert _postgres_running(tmp_path / "postgres") is not None
        bench.kill()
        bench.wait()
        deadline = time.monotonic() + 90
        while _postgres_running(tmp_path / "postgres") is not None or devstack._in_use(port):
            assert time.monotonic() < deadline, (tmp_path / "stack.log").read_text()
            time.sleep(0.2)
    finally:
        if bench.poll() is None:
            bench.kill()
        left = _postgres_running(tmp_path / "postgres")
        if left is not None:
            os.kill(left, signal.SIGTERM)


def test_the_terminal_closing_stops_every_service_gracefully(tmp_path: Path) -> None:
    """SIGHUP to memctl up's whole process group, as a closing terminal sends it: memctl
    stops each service with SIGTERM, and the API shuts down in order (its pending meter
    counts flushed) instead of dying of the SIGHUP."""
    up, log_path = _memctl_up(
        tmp_path,
        lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
        start_new_session=True,  # a terminal's job: its own process group
    )
    try:
        deadline = time.monotonic() + 120
        while "REST:" not in log_path.read_text():  # ready: the welcome is printed
            assert up.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        os.killpg(up.pid, signal.SIGHUP)
        up.wait(timeout=60)
        assert "Application shutdown complete" in log_path.read_text(), log_path.read_text()
        assert _postgres_running(tmp_path / "postgres") is None
    finally:
        if up.poll() is None:
            up.kill()


# The ignored exception is the point: pytest reports it as unraisable.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_stop_whose_interrupt_is_lost_in_a_fork_still_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A signal that lands while a service is forked runs its handler in an at-fork callback,
    where Python ignores the KeyboardInterrupt it raises: memctl up once started every
    service after it and ran on. The start's next step unwinds instead."""
    monkeypatch.setattr(devstack, "_stop_requested", False)
    fired: list[bool] = []

    def signal_during_the_fork() -> None:
        if not fired:  # at-fork callbacks stay registered: only the first fork is hit
            fired.append(True)
            devstack._stop_on_signal(signal.SIGTERM, None)

    os.register_at_fork(after_in_parent=signal_during_the_fork)
    # preexec_fn, as memctl up's services have, makes the fork run the callbacks.
    subprocess.run([sys.executable, "-c", "pass"], preexec_fn=os.getpid, check=True)
    assert fired
    with pytest.raises(KeyboardInterrupt):
        devstack._wait_ready("a service", lambda: True, [], timeout=5)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert devstack._supervise([]) is None
    finally:  # _supervise leaves memctl's own handlers, which pytest must not keep
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def test_a_stop_while_a_service_is_started_waits_for_its_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The signal's handler raises nothing while a service is started, where it could run in a
    fork's callback (the interrupt then lost, and its traceback printed); the start unwinds
    right after, with the service in the list of those to stop."""
    monkeypatch.setattr(devstack, "_stop_requested", False)
    started: list[str] = []
    with pytest.raises(KeyboardInterrupt), devstack._holding_signals():
        devstack._stop_on_signal(signal.SIGTERM, None)
        started.append("embed_service")
    assert started == ["embed_service"]
    assert not devstack._signals_held
