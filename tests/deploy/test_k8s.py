"""The Kubernetes manifests: schema-valid, consistent with each other and with the code."""

from __future__ import annotations

import re

import pytest
from kubernetes_validate import utils as kv

from embed_service.assembly import MODEL_NAME
from index_service.routing import routing_epoch
from index_service.settings import IndexSettings

from .manifests import (
    HELPER_VARS,
    K8S,
    POSTGRES,
    SETTINGS_BY_IMAGE,
    Doc,
    containers,
    env_of,
    find,
    image_name,
    kubectl_kustomize,
    kustomization,
    one,
    pod_spec,
    resources,
    settings_env_names,
    shard_entries,
)

# The oldest Kubernetes minor these manifests target, and the newest the schemas know.
K8S_VERSIONS = ["1.30.0", kv.latest_version()]
DOCS = resources()
WORKLOADS = [d for d in DOCS if d["kind"] in {"Deployment", "StatefulSet", "Job"}]
HEALTHCHECK = "/opt/memory/healthcheck.py"
DB_SECRET_SUFFIX = "-app"  # CloudNativePG names the application user's Secret <cluster>-app


def _id(doc: Doc) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("doc", DOCS, ids=_id)
def test_manifest_validates_against_kubernetes_schema(doc: Doc, version: str) -> None:
    """Strict: unknown fields are errors too (a misspelt key is not silently dropped)."""
    kv.validate(doc, version, strict=True)


def test_schema_validation_catches_a_misspelt_field() -> None:
    broken = {**one(DOCS, "Service", "api")}
    broken["spec"] = {**broken["spec"], "selectr": {"a": "b"}}
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, K8S_VERSIONS[0], strict=True)


def _unhashed_id(doc: Doc) -> str:
    """_id without the content hash kustomize appends to generated ConfigMap names."""
    if doc["kind"] == "ConfigMap":
        return re.sub(r"-[a-z0-9]{10}$", "", _id(doc))
    return _id(doc)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_rendered_kustomization_validates(version: str) -> None:
    """What `kubectl apply -k` would send: namespace, labels and hashed names applied."""
    rendered = kubectl_kustomize(K8S)
    if rendered is None:
        pytest.skip("kubectl is not installed; the plain manifests are validated above")
    assert sorted(map(_unhashed_id, rendered)) == sorted(map(_id, DOCS))
    for doc in rendered:
        kv.validate(doc, version, strict=True)
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == kustomization(K8S)["namespace"]
    # The generated ConfigMap's hashed name is what the workloads end up referencing.
    shards_map = next(d for d in rendered if d["kind"] == "ConfigMap")
    refs = {
        entry["valueFrom"]["configMapKeyRef"]["name"]
        for _, container in containers(rendered)
        for entry in container.get("env", [])
        if "configMapKeyRef" in entry.get("valueFrom", {})
    }
    assert refs == {shards_map["metadata"]["name"]}


def test_every_manifest_file_is_deployed() -> None:
    listed = set(kustomization(K8S)["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk


# --- the shard list -------------------------------------------------------------------------


def _shards_config() -> tuple[Doc, str]:
    config_maps = find(DOCS, "ConfigMap")
    assert len(config_maps) == 1
    return config_maps[0], "shards"


def _shard_list() -> list[str]:
    config, key = _shards_config()
    return [s.strip() for s in config["data"][key].split(",") if s.strip()]


def test_shard_list_matches_statefulset_pods() -> None:
    sts = one(DOCS, "StatefulSet", "index")
    service = one(DOCS, "Service", sts["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None", "pod DNS names need a headless Service"
    assert service["spec"]["publishNotReadyAddresses"] is True
    container_port = pod_spec(sts)["containers"][0]["ports"][0]["containerPort"]
    assert service["spec"]["ports"][0]["port"] == container_port
    assert _shard_list() == shard_entries(sts, service)
    assert len(set(_shard_list())) == len(_shard_list())


def _shards_ref(workload: Doc, var: str) -> tuple[str, str]:
    (container,) = pod_spec(workload)["containers"]
    ref = env_of(container)[var]["valueFrom"]["configMapKeyRef"]
    return ref["name"], ref["key"]


def test_api_and_shards_read_the_same_list() -> None:
    """Same strings on both sides: the routing epoch is a hash of the list."""
    config, key = _shards_config()
    expected = (config["metadata"]["name"], key)
    assert _shards_ref(one(DOCS, "Deployment", "api"), "MEMORY_INDEX_SHARDS") == expected
    assert _shards_ref(one(DOCS, "StatefulSet", "index"), "INDEX_SHARDS") == expected


def test_each_shard_names_itself_by_its_pod_name() -> None:
    sts = one(DOCS, "StatefulSet", "index")
    service = one(DOCS, "Service", sts["spec"]["serviceName"])
    (container,) = pod_spec(sts)["containers"]
    env = env_of(container)
    names = list(env)
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # $(VAR) expands only variables defined earlier in the list.
    assert names.index("POD_NAME") < names.index("INDEX_SHARD_NAME")
    template = env["INDEX_SHARD_NAME"]["value"]
    port = env["INDEX_PORT"]["value"]
    for i, entry in enumerate(shard_entries(sts, service)):
        pod = f"{sts['metadata']['name']}-{i}"
        assert template.replace("$(POD_NAME)", pod) == entry
        assert entry.endswith(f":{port}")
    assert routing_epoch(_shard_list()) == routing_epoch(shard_entries(sts, service))


# --- env and settings -----------------------------------------------------------------------


def _settings_for(container: Doc) -> type:
    return SETTINGS_BY_IMAGE[image_name(container["image"])]


@pytest.mark.parametrize(
    "pair", list(containers(DOCS)), ids=lambda p: f"{_id(p[0])}:{p[1]['name']}"
)
def test_env_vars_exist_in_settings(pair: tuple[Doc, Doc]) -> None:
    _, container = pair
    known = settings_env_names(_settings_for(container)) | HELPER_VARS
    unknown = set(env_of(container)) - known
    assert not unknown, f"not read by {_settings_for(container).__name__}: {sorted(unknown)}"


def resolve_env(workload: Doc, container: Doc) -> dict[str, str]:
    """The environment Kubernetes would give the container's first pod (Secrets stubbed)."""
    resolved: dict[str, str] = {}
    for name, entry in env_of(container).items():
        if "value" in entry:
            value = re.sub(r"\$\((\w+)\)", lambda m: resolved[m.group(1)], entry["value"])
        elif "configMapKeyRef" in entry["valueFrom"]:
            ref = entry["valueFrom"]["configMapKeyRef"]
            value = one(DOCS, "ConfigMap", ref["name"])["data"][ref["key"]]
        elif "secretKeyRef" in entry["valueFrom"]:
            value = "postgresql://app:secret@memory-db-rw:5432/app"
        else:
            assert entry["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
            value = f"{workload['metadata']['name']}-0"
        resolved[name] = value
    return resolved


@pytest.mark.parametrize(
    "pair", list(containers(DOCS)), ids=lambda p: f"{_id(p[0])}:{p[1]['name']}"
)
def test_env_values_parse(pair: tuple[Doc, Doc], monkeypatch: pytest.MonkeyPatch) -> None:
    """The values pass the settings' own validation (types, ranges, choices)."""
    workload, container = pair
    cls = _settings_for(container)
    for name in settings_env_names(cls):
        monkeypatch.delenv(name, raising=False)
    for name, value in resolve_env(workload, container).items():
        monkeypatch.setenv(name, value)
    settings = cls()
    if isinstance(settings, IndexSettings):
        # index_service refuses to start when its own name is not in the list.
        assert settings.shard_name in settings.shards
        assert settings.shards == _shard_list()


def test_settings_env_names_know_aliases_and_nesting() -> None:
    from api_service.settings import ApiSettings

    names = settings_env_names(ApiSettings)
    assert {"DATABASE_URL", "MEMORY_INDEX_SHARDS", "MEMORY_LIMITS__BODY_BYTES"} <= names
    assert "MEMORY_DATABASE_URL" in names
    assert "MEMORY_NO_SUCH_SETTING" not in names


def test_database_url_comes_from_the_postgres_cluster_secret() -> None:
    (cluster,) = (d for d in _postgres_docs() if d["kind"] == "Cluster")
    secret = cluster["metadata"]["name"] + DB_SECRET_SUFFIX
    seen = 0
    for workload, container in containers(DOCS):
        env = env_of(container)
        if image_name(container["image"]) == "memory-embed":
            assert "DATABASE_URL" not in env
            continue
        ref = env["DATABASE_URL"]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == (secret, "uri"), _id(workload)
        seen += 1
    assert seen == 3  # api, index, migrate


# --- workloads ------------------------------------------------------------------------------


@pytest.mark.parametrize("workload", WORKLOADS, ids=_id)
def test_workload_runs_hardened_with_resources(workload: Doc) -> None:
    spec = pod_spec(workload)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert spec["automountServiceAccountToken"] is False
    for container in spec["containers"]:
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(container["resources"][kind]), kind


@pytest.mark.parametrize("workload", WORKLOADS, ids=_id)
def test_selectors_match_pod_labels(workload: Doc) -> None:
    labels = workload["spec"]["template"]["metadata"]["labels"]
    if workload["kind"] != "Job":
        assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items()


def _pods_selected(selector: dict[str, str]) -> list[Doc]:
    return [
        w
        for w in WORKLOADS
        if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
    ]


@pytest.mark.parametrize("service", find(DOCS, "Service"), ids=_id)
def test_service_selects_a_workload_and_its_named_port(service: Doc) -> None:
    (workload,) = _pods_selected(service["spec"]["selector"])
    port_names = {p["name"] for c in pod_spec(workload)["containers"] for p in c["ports"]}
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in port_names


def test_every_long_running_workload_has_a_disruption_budget() -> None:
    budgets = find(DOCS, "PodDisruptionBudget")
    covered = {
        w["metadata"]["name"]
        for b in budgets
        for w in _pods_selected(b["spec"]["selector"]["matchLabels"])
    }
    assert covered == {w["metadata"]["name"] for w in WORKLOADS if w["kind"] != "Job"}


def test_api_autoscales_and_probes_its_endpoints() -> None:
    api = one(DOCS, "Deployment", "api")
    hpa = one(DOCS, "HorizontalPodAutoscaler", "api")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "api",
    }
    assert 2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    assert "replicas" not in api["spec"], "the HPA owns the replica count"
    (container,) = pod_spec(api)["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    port = int(env_of(container)["MEMORY_PORT"]["value"])
    assert container["ports"][0]["containerPort"] == port
    # The database pool bound times the largest replica count fits the server's connections.
    (cluster,) = (d for d in _postgres_docs() if d["kind"] == "Cluster")
    pool_max = int(env_of(container)["MEMORY_DB_POOL_MAX"]["value"])
    max_connections = int(cluster["spec"]["postgresql"]["parameters"]["max_connections"])
    assert hpa["spec"]["maxReplicas"] * pool_max < max_connections


@pytest.mark.parametrize("name", ["embed", "index"])
def test_grpc_services_probe_their_health_rpc(name: str) -> None:
    """Exec probes: the services implement memory.v1 Health, not grpc.health.v1."""
    workload = find(DOCS, "Deployment", name) + find(DOCS, "StatefulSet", name)
    (container,) = pod_spec(workload[0])["containers"]
    port = container["ports"][0]["containerPort"]
    target = f"127.0.0.1:{port}"
    expected = ["python", HEALTHCHECK, name, target]
    assert container["readinessProbe"]["exec"]["command"] == expected
    assert container["livenessProbe"]["exec"]["command"] == [*expected, "--live"]
    assert container["startupProbe"]["exec"]["command"] == [*expected, "--live"]


@pytest.mark.parametrize("name", ["embed", "index"])
def test_only_the_api_reaches_the_grpc_services(name: str) -> None:
    """They take no credentials, so a NetworkPolicy admits the api's pods alone, on the gRPC
    port only."""
    workload = (find(DOCS, "Deployment", name) + find(DOCS, "StatefulSet", name))[0]
    pod_labels = workload["spec"]["template"]["metadata"]["labels"]
    api_labels = one(DOCS, "Deployment", "api")["spec"]["template"]["metadata"]["labels"]
    (policy,) = [
        p
        for p in find(DOCS, "NetworkPolicy")
        if p["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    ]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    (source,) = rule["from"]
    assert source["podSelector"]["matchLabels"].items() <= api_labels.items()
    (container,) = pod_spec(workload)["containers"]
    assert [p["port"] for p in rule["ports"]] == [container["ports"][0]["name"]]


def test_each_api_pod_balances_over_every_embed_pod() -> None:
    """The api's channel spreads calls over the addresses the name resolves to: the embed
    Service must be headless, and the server must close connections in time for new pods
    to be found (embed_service.main.MAX_CONNECTION_AGE_MS)."""
    service = one(DOCS, "Service", "embed")
    assert service["spec"]["clusterIP"] == "None"
    (container,) = pod_spec(one(DOCS, "Deployment", "api"))["containers"]
    assert env_of(container)["MEMORY_EMBED_ADDRESS"]["value"] == "embed:50051"


def test_index_threads_match_the_cpu_limit() -> None:
    """A process sees the node's cores, not its quota: the shard's request threads and
    FAISS's OpenMP threads are set to the container's CPU limit."""
    (container,) = pod_spec(one(DOCS, "StatefulSet", "index"))["containers"]
    limit = container["resources"]["limits"]["cpu"]
    env = env_of(container)
    assert env["INDEX_SEARCH_THREADS"]["value"] == env["OMP_NUM_THREADS"]["value"] == limit


def test_a_stopping_api_pod_serves_until_its_endpoints_are_gone() -> None:
    api = one(DOCS, "Deployment", "api")
    (container,) = pod_spec(api)["containers"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["python", "-c"] and "sleep(5)" in command[2]
    assert pod_spec(api)["terminationGracePeriodSeconds"] > 5


def test_embed_runs_on_gpu_nodes_with_the_baked_model() -> None:
    embed = one(DOCS, "Deployment", "embed")
    spec = pod_spec(embed)
    (container,) = spec["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert spec["nodeSelector"]
    assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    env = env_of(container)
    assert env["EMBED_DEVICE"]["value"] == "cuda"
    assert env["EMBED_MODEL_DIR"]["value"] == f"/opt/model/{MODEL_NAME}"
    # A surge pod would wait for a spare GPU.
    assert embed["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0


def test_migration_job_runs_memctl_migrate() -> None:
    (job,) = find(DOCS, "Job")
    (container,) = pod_spec(job)["containers"]
    assert container["command"] == ["memctl", "migrate"]
    assert image_name(container["image"]) == "memory-api"


def test_images_are_pinned_by_the_kustomization() -> None:
    pinned = {i["name"]: i for i in kustomization(K8S)["images"]}
    used = {image_name(c["image"]) for _, c in containers(DOCS)}
    assert used == set(pinned) == set(SETTINGS_BY_IMAGE)
    assert all(i.get("newTag") or i.get("digest") for i in pinned.values())


# --- PostgreSQL (CloudNativePG) -------------------------------------------------------------


def _postgres_docs() -> list[Doc]:
    return resources(POSTGRES)


def test_postgres_cluster_structure() -> None:
    """The Cluster is a CRD the core schemas do not cover: check the fields we rely on."""
    (cluster,) = _postgres_docs()
    assert cluster["apiVersion"] == "postgresql.cnpg.io/v1"
    assert cluster["kind"] == "Cluster"
    spec = cluster["spec"]
    assert spec["instances"] >= 2, "a replica to fail over to"
    assert re.fullmatch(r"\d+(Gi|Ti)", spec["storage"]["size"])
    major = int(re.search(r":(\d+)", spec["imageName"]).group(1))  # type: ignore[union-attr]
    assert major >= 15, "the schema needs PostgreSQL 15 or later"
    assert {"database", "owner"} <= set(spec["bootstrap"]["initdb"])
    assert kustomization(POSTGRES)["namespace"] == kustomization(K8S)["namespace"]
