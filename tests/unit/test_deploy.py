"""The deployment kit in deploy/, checked statically (no cluster, systemd or Docker here): the
manifests parse, every LEASEWORK_* variable they name is one the product reads and their values
load, the probes point at the ops port each role listens on, the drain fits inside the grace
period and the stop timeout, and the units and containers run real roles."""

import pathlib
import re
import shlex

import pytest
import yaml

from leasework import config, metrics
from leasework.cli import ROLES

ROOT = pathlib.Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
SYSTEMD = ROOT / "deploy" / "systemd"
DEPLOYED_ROLES = ("api", "relay", "worker")
EXECUTABLE = "/opt/leasework/venv/bin/leasework"
MARGIN = 5.0  # seconds the grace period / stop timeout must leave above the drain
DEFAULT_SHUTDOWN = config.Settings(role="relay", process_name="relay").shutdown_timeout
VARIABLE = re.compile(r"\bLEASEWORK_[A-Z0-9_]*[A-Z0-9]")


def allowed_variables() -> set[str]:
    return {f"LEASEWORK_{key.upper()}" for key in config.known_keys()} | {
        "LEASEWORK_CONFIG",
        "LEASEWORK_TOKEN",
        "LEASEWORK_TOKEN_FILE",
        "LEASEWORK_API_URL",
    }


# --- Kubernetes -----------------------------------------------------------------------------


def manifest_files() -> list[pathlib.Path]:
    return sorted(KUBERNETES.glob("*.yaml"))


def documents() -> list[dict]:
    docs = []
    for path in manifest_files():
        docs.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None)
    return docs


def of_kind(kind: str) -> list[dict]:
    return [doc for doc in documents() if doc["kind"] == kind]


def one(kind: str, name: str) -> dict:
    found = [doc for doc in of_kind(kind) if doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def deployment(role: str) -> dict:
    return one("Deployment", f"leasework-{role}")


def container(workload: dict) -> dict:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def pod_environment(workload: dict) -> dict[str, str]:
    """What the container sees: the ConfigMap and the Secret of its envFrom, then its env
    (which wins); variables from a fieldRef are left out (they have no value here)."""
    spec = container(workload)
    env: dict[str, str] = {}
    for source in spec.get("envFrom", []):
        if "configMapRef" in source:
            env.update(one("ConfigMap", source["configMapRef"]["name"])["data"])
        if "secretRef" in source:
            env.update(one("Secret", source["secretRef"]["name"])["stringData"])
    for item in spec.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
    return env


def resolved_port(spec: dict, port: int | str) -> int:
    if isinstance(port, int):
        return port
    named = [p["containerPort"] for p in spec.get("ports", []) if p.get("name") == port]
    assert named, f"probe port {port!r} names no container port"
    return named[0]


def prestop_seconds(spec: dict) -> float:
    pre_stop = spec.get("lifecycle", {}).get("preStop")
    if pre_stop is None:
        return 0.0
    if "sleep" in pre_stop:
        return float(pre_stop["sleep"]["seconds"])
    command = pre_stop["exec"]["command"]
    assert command[0] == "sleep" and len(command) == 2, f"preStop {command} is not a sleep"
    return float(command[1])


def test_every_manifest_parses_into_named_objects():
    assert manifest_files(), "no manifests in deploy/kubernetes"
    for path in manifest_files():
        docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
        assert docs, f"{path.name} holds no object"
        for doc in docs:
            assert isinstance(doc, dict), f"{path.name}: {doc!r} is not an object"
            for key in ("apiVersion", "kind", "metadata"):
                assert key in doc, f"{path.name}: an object has no {key}"
            assert doc["metadata"].get("name"), f"{path.name}: a {doc['kind']} has no name"


def test_the_kit_holds_every_object_it_promises():
    for role in DEPLOYED_ROLES:
        deployment(role)
        one("PodDisruptionBudget", f"leasework-{role}")
    one("Service", "leasework-api")
    one("ConfigMap", "leasework")
    one("Secret", "leasework")
    assert len(of_kind("Job")) == 1
    one("ScaledObject", "leasework-worker")


@pytest.mark.parametrize("role", DEPLOYED_ROLES)
def test_each_deployment_runs_its_role_with_settings_that_load(role):
    workload = deployment(role)
    spec = container(workload)
    assert spec["command"][:2] == ["leasework", role]
    assert spec["command"][1] in ROLES
    assert workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == role
    config.load(role, pod_environment(workload))  # raises ConfigError on a bad value


def test_the_migrate_job_runs_migrate_and_never_restarts_in_place():
    (job,) = of_kind("Job")
    spec = container(job)
    assert spec["command"] == ["leasework", "migrate"]
    assert "migrate" in ROLES
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    config.load("migrate", pod_environment(job))


@pytest.mark.parametrize("role", DEPLOYED_ROLES)
def test_probes_point_at_the_ops_port_the_role_listens_on(role):
    workload = deployment(role)
    spec = container(workload)
    raw = pod_environment(workload)["LEASEWORK_OPS_ADDR"]
    host, _, _ = raw.rpartition(":")
    assert host in ("", "0.0.0.0", "[::]"), f"{role} listens on {raw}: the kubelet cannot reach it"
    settings = config.load(role, pod_environment(workload))
    assert settings.ops_addr is not None
    port = settings.ops_addr[1]
    assert port == int(config.DEFAULT_OPS_ADDR[role].rpartition(":")[2])
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = spec[probe]["httpGet"]
        assert get["path"] == path, f"{role} {probe} asks {get['path']}"
        assert resolved_port(spec, get["port"]) == port, f"{role} {probe} is not on {port}"


@pytest.mark.parametrize("role", DEPLOYED_ROLES)
def test_grace_period_exceeds_prestop_and_drain(role):
    workload = deployment(role)
    pod = workload["spec"]["template"]["spec"]
    settings = config.load(role, pod_environment(workload))
    needed = prestop_seconds(container(workload)) + settings.shutdown_timeout + MARGIN
    grace = pod.get("terminationGracePeriodSeconds", 30)
    assert grace >= needed, (
        f"{role}: terminationGracePeriodSeconds={grace} but preStop + "
        f"LEASEWORK_SHUTDOWN_TIMEOUT ({settings.shutdown_timeout}s) + {MARGIN}s = {needed}"
    )


@pytest.mark.parametrize("role", DEPLOYED_ROLES)
def test_a_disruption_budget_covers_each_role(role):
    budget = one("PodDisruptionBudget", f"leasework-{role}")
    labels = deployment(role)["spec"]["template"]["metadata"]["labels"]
    selector = budget["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items(), f"{role}'s budget selects other pods"
    assert "minAvailable" in budget["spec"] or "maxUnavailable" in budget["spec"]


def test_the_api_service_reaches_the_api_pods():
    service = one("Service", "leasework-api")
    api = deployment("api")
    labels = api["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    ports = [resolved_port(container(api), p["targetPort"]) for p in service["spec"]["ports"]]
    assert ports == [config.load("api", pod_environment(api)).ops_addr[1]]


def test_workers_scale_on_the_consumer_lag_the_relay_exports():
    scaled = one("ScaledObject", "leasework-worker")
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment("worker")["metadata"]["name"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    query = trigger["metadata"]["query"]
    metric = metrics.consumer_lag.describe()[0].name
    assert metric == "leasework_consumer_lag"
    assert re.search(rf"\bsum\b.*\b{metric}\b", query), query
    assert float(trigger["metadata"]["threshold"]) > 0
    assert 1 <= scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"]


# --- systemd --------------------------------------------------------------------------------


def unit_files() -> list[pathlib.Path]:
    return sorted(SYSTEMD.glob("*.service"))


def parse_unit(path: pathlib.Path) -> dict[str, list[tuple[str, str]]]:
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, f"{path.name}: cannot read {line!r}"
        current.append((key.strip(), value.strip()))
    return sections


def values(unit: dict, section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def value(unit: dict, section: str, key: str) -> str:
    found = values(unit, section, key)
    assert len(found) == 1, f"{section}.{key}: expected one value, found {found}"
    return found[0]


def env_file() -> dict[str, str]:
    env = {}
    for line in (SYSTEMD / "leasework.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, val = line.partition("=")
            assert sep, f"leasework.env: cannot read {line!r}"
            env[key] = val
    return env


def unit_role(path: pathlib.Path) -> str:
    return path.name.removeprefix("leasework-").split("@")[0].removesuffix(".service")


def unit_environment(unit: dict) -> dict[str, str]:
    """The unit's Environment= (instance 9101, host "host"), then EnvironmentFile= over it (as
    systemd does), with LEASEWORK_CONFIG pointed at the example file beside the units."""
    env = {}
    for item in values(unit, "Service", "Environment"):
        for assignment in shlex.split(item):
            key, _, val = assignment.partition("=")
            env[key] = val.replace("%i", "9101").replace("%H", "host")
    assert values(unit, "Service", "EnvironmentFile") == ["/etc/leasework/leasework.env"]
    env.update(env_file())
    assert env["LEASEWORK_CONFIG"] == "/etc/leasework/leasework.toml"
    env["LEASEWORK_CONFIG"] = str(SYSTEMD / "leasework.toml")
    return env


def test_the_kit_holds_a_unit_per_role_and_a_worker_template():
    names = {path.name for path in unit_files()}
    assert names == {
        "leasework-api.service",
        "leasework-relay.service",
        "leasework-worker@.service",
        "leasework-migrate.service",
    }


@pytest.mark.parametrize("path", unit_files(), ids=lambda p: p.name)
def test_each_unit_runs_a_real_role_with_settings_that_load(path):
    unit = parse_unit(path)
    executable, role, *rest = shlex.split(value(unit, "Service", "ExecStart"))
    assert executable == EXECUTABLE
    assert role in ROLES and role == unit_role(path)
    assert rest == []
    config.load(role, unit_environment(unit))


@pytest.mark.parametrize("path", unit_files(), ids=lambda p: p.name)
def test_each_unit_runs_unprivileged_and_hardened(path):
    unit = parse_unit(path)
    assert value(unit, "Service", "User") not in ("", "root", "0")
    assert value(unit, "Service", "NoNewPrivileges") == "yes"
    assert value(unit, "Service", "ProtectSystem") == "strict"
    assert value(unit, "Service", "PrivateTmp") == "yes"


@pytest.mark.parametrize(
    "path", [p for p in unit_files() if unit_role(p) != "migrate"], ids=lambda p: p.name
)
def test_role_units_stop_after_the_drain_restart_on_failure_and_wait_for_migrate(path):
    unit = parse_unit(path)
    role = unit_role(path)
    assert value(unit, "Service", "KillSignal") == "SIGTERM"
    assert value(unit, "Service", "Restart") == "on-failure"
    settings = config.load(role, unit_environment(unit))
    stop = config.parse_duration("TimeoutStopSec", value(unit, "Service", "TimeoutStopSec"))
    assert stop >= settings.shutdown_timeout + MARGIN, (
        f"{path.name}: TimeoutStopSec={stop}s leaves no margin above "
        f"LEASEWORK_SHUTDOWN_TIMEOUT={settings.shutdown_timeout}s"
    )
    for key in ("Requires", "After"):
        listed = " ".join(values(unit, "Unit", key)).split()
        assert "leasework-migrate.service" in listed, f"{path.name}: no {key}= on migrate"
    port = settings.ops_addr[1]
    assert port == int(config.DEFAULT_OPS_ADDR[role].rpartition(":")[2])


def test_the_migrate_unit_is_a_oneshot():
    unit = parse_unit(SYSTEMD / "leasework-migrate.service")
    assert value(unit, "Service", "Type") == "oneshot"
    assert value(unit, "Service", "RemainAfterExit") == "yes"


def test_the_environment_file_leaves_each_unit_its_ops_port():
    # EnvironmentFile= overrides Environment=: an ops address here would put every worker on
    # one port
    assert "LEASEWORK_OPS_ADDR" not in env_file()
    assert "ops_addr" not in config.read_file(str(SYSTEMD / "leasework.toml"))


def test_the_example_toml_holds_only_known_keys():
    variables = config.read_file(str(SYSTEMD / "leasework.toml"))  # raises on an unknown key
    assert variables


# --- both -----------------------------------------------------------------------------------


def test_every_variable_named_in_the_kit_is_one_the_product_reads():
    allowed = allowed_variables()
    paths = [*manifest_files(), *unit_files(), SYSTEMD / "leasework.env"]
    named = {}
    for path in paths:
        for name in VARIABLE.findall(path.read_text()):
            named.setdefault(name, path.name)
    assert named, "the kit names no LEASEWORK_* variable"
    unknown = {name: where for name, where in named.items() if name not in allowed}
    assert not unknown, f"variables the product does not read: {unknown}"


def test_the_default_shutdown_timeout_is_what_the_kit_assumes():
    assert DEFAULT_SHUTDOWN == 20.0
