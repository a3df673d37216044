"""Reading the deployment files: kustomize resources, containers, env, and settings' env names."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import AliasChoices, BaseModel
from pydantic_settings import BaseSettings

from api_service.settings import ApiSettings
from embed_service.settings import EmbedSettings
from index_service.settings import IndexSettings

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
POSTGRES = K8S / "postgres"
COMPOSE = DEPLOY / "compose.yaml"
DOCKER = DEPLOY / "docker"

Doc = dict[str, Any]

# Which settings class reads the environment of each image.
SETTINGS_BY_IMAGE: dict[str, type[BaseSettings]] = {
    "memory-api": ApiSettings,
    "memory-embed": EmbedSettings,
    "memory-index": IndexSettings,
}
# Variables a manifest may set that no settings class reads: the downward-API pod name, used
# only to build INDEX_SHARD_NAME by Kubernetes' $(VAR) expansion, and OpenMP's thread count,
# which FAISS reads.
HELPER_VARS = {"POD_NAME", "OMP_NUM_THREADS"}


def load_yaml_docs(path: Path) -> list[Doc]:
    """Every non-empty document of a YAML file."""
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def kustomization(folder: Path) -> Doc:
    """The kustomization.yaml of `folder`."""
    docs = load_yaml_docs(folder / "kustomization.yaml")
    assert len(docs) == 1
    return docs[0]


def generated_config_maps(kust: Doc) -> list[Doc]:
    """ConfigMaps from configMapGenerator literals, named as in the manifests (no hash)."""
    maps = []
    for gen in kust.get("configMapGenerator", []):
        data = dict(literal.split("=", 1) for literal in gen.get("literals", []))
        maps.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": gen["name"]},
                "data": data,
            }
        )
    return maps


def resources(folder: Path = K8S) -> list[Doc]:
    """The objects a kustomization declares: its resource files plus generated ConfigMaps.

    Plain reading, without kustomize's transformations (namespace, labels, name hashes), so
    names compare as written in the manifests.
    """
    kust = kustomization(folder)
    docs: list[Doc] = []
    for name in kust.get("resources", []):
        docs.extend(load_yaml_docs(folder / name))
    return docs + generated_config_maps(kust)


def kubectl_kustomize(folder: Path) -> list[Doc] | None:
    """The rendered output of `kubectl kustomize`, or None where kubectl is not installed."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return None
    out = subprocess.run(
        [kubectl, "kustomize", str(folder)], check=True, capture_output=True, text=True
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def find(docs: list[Doc], kind: str, name: str | None = None) -> list[Doc]:
    """Objects of `kind` (and `name`, when given)."""
    return [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    """The single object of `kind` named `name`."""
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_spec(workload: Doc) -> Doc:
    """The pod spec of a Deployment, StatefulSet or Job."""
    spec: Doc = workload["spec"]["template"]["spec"]
    return spec


def containers(docs: list[Doc]) -> Iterator[tuple[Doc, Doc]]:
    """(workload, container) for every container of every pod-template workload."""
    for doc in docs:
        if doc["kind"] in {"Deployment", "StatefulSet", "Job", "DaemonSet"}:
            spec = pod_spec(doc)
            for container in spec.get("initContainers", []) + spec["containers"]:
                yield doc, container


def image_name(image: str) -> str:
    """`registry/name:tag` -> `name`."""
    return image.rsplit("/", 1)[-1].split(":", 1)[0].split("@", 1)[0]


def env_of(container: Doc) -> dict[str, Doc]:
    """A container's env entries by name."""
    return {entry["name"]: entry for entry in container.get("env", [])}


def settings_env_names(cls: type[BaseSettings]) -> set[str]:
    """Every environment variable name a settings class reads (upper case).

    Fields with validation aliases are read under those aliases; nested models (with the
    class's env_nested_delimiter) add `<PREFIX><FIELD><DELIM><SUBFIELD>`.
    """
    prefix = str(cls.model_config.get("env_prefix", "")).upper()
    delimiter = cls.model_config.get("env_nested_delimiter")
    names: set[str] = set()
    for field_name, info in cls.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(str(choice).upper() for choice in alias.choices)
        elif isinstance(alias, str):
            names.add(alias.upper())
        else:
            names.add(f"{prefix}{field_name}".upper())
        annotation = info.annotation
        if delimiter and isinstance(annotation, type) and issubclass(annotation, BaseModel):
            for sub in annotation.model_fields:
                names.add(f"{prefix}{field_name}{delimiter}{sub}".upper())
    return names


def shard_entries(statefulset: Doc, service: Doc) -> list[str]:
    """The shard list a StatefulSet's pods form: `<sts>-<i>.<service>:<port>`, in pod order."""
    name = statefulset["metadata"]["name"]
    port = service["spec"]["ports"][0]["port"]
    svc = service["metadata"]["name"]
    return [f"{name}-{i}.{svc}:{port}" for i in range(statefulset["spec"]["replicas"])]
