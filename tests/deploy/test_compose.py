"""deploy/compose.yaml: structure, env names against the settings, the shard list."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import pytest

from index_service.routing import routing_epoch

from .manifests import (
    COMPOSE,
    SETTINGS_BY_IMAGE,
    Doc,
    image_name,
    load_yaml_docs,
    settings_env_names,
)

(COMPOSE_DOC,) = load_yaml_docs(COMPOSE)
SERVICES: dict[str, Doc] = COMPOSE_DOC["services"]
APP_SERVICES = {name: svc for name, svc in SERVICES.items() if name != "postgres"}
INDEX_SERVICES = sorted(name for name in SERVICES if name.startswith("index-"))
TOP_LEVEL_KEYS = {"name", "services", "volumes", "networks", "configs", "secrets"}


def _env(service: Doc) -> dict[str, str]:
    env = service.get("environment", {})
    assert isinstance(env, dict), "environment as a mapping"
    return {k: str(v) for k, v in env.items()}


def _shards(value: str) -> list[str]:
    return [s.strip() for s in value.split(",") if s.strip()]


def test_top_level_structure() -> None:
    assert set(COMPOSE_DOC) - TOP_LEVEL_KEYS <= {k for k in COMPOSE_DOC if k.startswith("x-")}
    for name, service in SERVICES.items():
        assert "image" in service, name
        for dependency in service.get("depends_on", {}):
            assert dependency in SERVICES, f"{name} depends on unknown {dependency}"
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            assert source in COMPOSE_DOC.get("volumes", {}), f"{name}: volume {source}"


@pytest.mark.parametrize(
    "name", sorted(n for n, s in APP_SERVICES.items() if s.get("restart") == "unless-stopped")
)
def test_long_running_services_get_time_to_stop(name: str) -> None:
    """Docker kills a container 10 s after SIGTERM by default, as embed_service's own grace
    for calls under way ends: each service gets what Kubernetes gives it."""
    grace = SERVICES[name].get("stop_grace_period", "")
    assert grace.endswith("s") and int(grace[:-1]) >= 30, name


@pytest.mark.parametrize("name", sorted(APP_SERVICES))
def test_env_vars_exist_in_settings(name: str) -> None:
    service = SERVICES[name]
    cls = SETTINGS_BY_IMAGE[image_name(service["image"])]
    unknown = set(_env(service)) - settings_env_names(cls)
    assert not unknown, f"{name}: not read by {cls.__name__}: {sorted(unknown)}"


@pytest.mark.parametrize("name", sorted(APP_SERVICES))
def test_env_values_parse(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    service = SERVICES[name]
    cls = SETTINGS_BY_IMAGE[image_name(service["image"])]
    for var in settings_env_names(cls):
        monkeypatch.delenv(var, raising=False)
    for var, value in _env(service).items():
        # ${VAR:-default} and ${VAR:?message} as compose interpolates them with VAR unset.
        value = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)
        monkeypatch.setenv(var, re.sub(r"\$\{\w+:\?[^}]*\}", "secret", value))
    cls()


def test_shard_list_matches_the_index_services() -> None:
    api_shards = _shards(_env(SERVICES["api"])["MEMORY_INDEX_SHARDS"])
    assert len(INDEX_SERVICES) == 2
    assert [s.split(":")[0] for s in api_shards] == INDEX_SERVICES
    for name in INDEX_SERVICES:
        env = _env(SERVICES[name])
        assert _shards(env["INDEX_SHARDS"]) == api_shards
        assert routing_epoch(_shards(env["INDEX_SHARDS"])) == routing_epoch(api_shards)
        assert env["INDEX_SHARD_NAME"] == f"{name}:50061"
        assert env["INDEX_SHARD_NAME"] in api_shards


def test_embed_reserves_a_gpu() -> None:
    embed = SERVICES["embed"]
    (device,) = embed["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert "gpu" in device["capabilities"]
    assert _env(SERVICES["api"])["MEMORY_EMBED_ADDRESS"] == "embed:50051"


def test_migration_runs_before_the_api() -> None:
    migrate = SERVICES["migrate"]
    assert migrate["command"] == ["memctl", "migrate"]
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert SERVICES["api"]["depends_on"]["migrate"]["condition"] == (
        "service_completed_successfully"
    )
    assert _env(migrate)["DATABASE_URL"] == _env(SERVICES["api"])["DATABASE_URL"]
    assert "healthcheck" in SERVICES["postgres"]


def test_images_are_built_from_existing_dockerfiles() -> None:
    built: dict[str, Any] = {}
    for name, service in SERVICES.items():
        if "build" in service:
            context = (COMPOSE.parent / service["build"]["context"]).resolve()
            dockerfile = context / service["build"]["dockerfile"]
            assert dockerfile.is_file(), f"{name}: {dockerfile}"
            built[image_name(service["image"])] = dockerfile
    assert set(built) == set(SETTINGS_BY_IMAGE)


def test_docker_compose_config_accepts_the_file() -> None:
    """The compose CLI's own validation, where the plugin is installed."""
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("docker is not installed")
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("the docker compose plugin is not installed")
    subprocess.run(
        [docker, "compose", "-f", str(COMPOSE), "config", "--quiet"],
        check=True,
        env={"POSTGRES_PASSWORD": "test", "PATH": "/usr/bin:/bin"},
    )
