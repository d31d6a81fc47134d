"""The Docker Compose topology in compose/, checked statically (no Docker engine here): the
compose file parses, every LEASEWORK_* variable it names is one the product reads and the
values load, dependencies name real services and the roles wait for migrate, healthchecks hit
real paths on each role's ops port, the stop grace period covers the drain, bind mounts exist,
the Dockerfile builds the wheel's console script, and Prometheus, Alertmanager, Grafana, Kafka
and its topics are wired as the local stack wires them. promtool, amtool and `docker compose`
are used where they exist."""

import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import tomllib
import urllib.parse
from pathlib import Path

import pytest
import yaml

from devstack.layout import ALERT_WEBHOOK_URL, KAFKA_TOPICS, KAFKA_VERSION
from devstack.services.alertmanager import render_alertmanager_yml
from leasework import config
from leasework.api.routes import ROUTES
from leasework.health import Health
from leasework.service import ops_app
from tests.unit.test_deploy import (
    DEPLOYED_ROLES,
    EXECUTABLE,
    MARGIN,
    ROOT,
    VARIABLE,
    allowed_variables,
)
from tests.unit.test_monitoring import RULES_DIR, needs_promtool, promtool

COMPOSE = ROOT / "compose"
COMPOSE_FILE = COMPOSE / "compose.yaml"
DOCKERFILE = COMPOSE / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PROMETHEUS_FILE = COMPOSE / "prometheus.yml"
ALERTMANAGER_FILE = COMPOSE / "alertmanager.yml"
GRAFANA_PROVISIONING = ROOT / "dashboards" / "grafana" / "provisioning"
# variables of the compose file itself (interpolated by Compose, never seen by leasework)
COMPOSE_VARIABLES = {"LEASEWORK_IMAGE"}
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
INTERPOLATION = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|\$([A-Za-z_]\w*)")


# --- reading the compose file ---------------------------------------------------------------


def interpolated(value: str) -> str:
    """``value`` as Compose hands it to a container when no variable is set: ``${NAME:-x}`` is
    x, ``$$`` a literal ``$``; a ``${NAME}`` or ``$NAME`` without a default fails, since a
    user running ``docker compose up`` has no .env."""

    def one(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        assert match.group(2) is not None, f"{match.group(0)} in {value!r} has no default"
        return match.group(2)

    return INTERPOLATION.sub(one, value)


def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def services() -> dict[str, dict]:
    return compose()["services"]


def service(name: str) -> dict:
    found = services().get(name)
    assert found is not None, f"compose.yaml has no service {name}"
    return found


def environment(name: str) -> dict[str, str]:
    env = service(name).get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: interpolated(str(val)) for key, val in env.items()}


def depends_on(name: str) -> dict[str, str]:
    """The services ``name`` waits for, each with its condition."""
    listed = service(name).get("depends_on", {})
    if isinstance(listed, list):
        return dict.fromkeys(listed, "service_started")
    return {dep: spec.get("condition", "service_started") for dep, spec in listed.items()}


def invocation(name: str) -> list[str]:
    """What the container runs, from the leasework executable on: the image's ENTRYPOINT and
    the service's command, or a ``sh -c`` entrypoint's script from its ``exec``."""
    spec = service(name)
    entrypoint = spec.get("entrypoint")
    if entrypoint is None:
        return [EXECUTABLE, *spec.get("command", [])]
    assert entrypoint[0] in ("/bin/sh", "/bin/bash") and entrypoint[1] in ("-c", "-ec")
    script = " ".join([*entrypoint[2:], *spec.get("command", [])])
    words = shlex.split(interpolated(script))
    assert EXECUTABLE in words, f"{name} does not run {EXECUTABLE}: {script!r}"
    return words[words.index(EXECUTABLE) :]


def bind_mounts(name: str) -> list[tuple[Path, str]]:
    """(host path, container path) of each bind mount of ``name`` (short syntax)."""
    mounts = []
    for volume in service(name).get("volumes", []):
        source, target, *_ = volume.split(":")
        if source.startswith((".", "/")):
            mounts.append(((COMPOSE / source).resolve(), target))
    return mounts


def named_volumes(name: str) -> dict[str, str]:
    """volume name -> container path, for the named volumes of ``name``."""
    found = {}
    for volume in service(name).get("volumes", []):
        source, target, *_ = volume.split(":")
        if not source.startswith((".", "/")):
            found[source] = target
    return found


def host_path(name: str, container_path: str) -> Path:
    """Where ``container_path`` of service ``name`` lives in the repository (a bind mount)."""
    for source, target in bind_mounts(name):
        if container_path == target or container_path.startswith(target.rstrip("/") + "/"):
            return source / container_path[len(target) :].lstrip("/")
    raise AssertionError(f"{container_path} of {name} is not bind-mounted from the repository")


def role_settings(role: str) -> config.Settings:
    return config.load(role, environment(role))


def ops_port(role: str) -> int:
    return int(config.DEFAULT_OPS_ADDR[role].rpartition(":")[2])


def healthcheck_url(name: str) -> urllib.parse.SplitResult:
    test = service(name)["healthcheck"]["test"]
    assert test[0] == "CMD", f"{name}: the healthcheck should run without a shell: {test}"
    (url,) = re.findall(r"https?://[^'\"\s]+", " ".join(test))
    return urllib.parse.urlsplit(url)


# --- the file as a whole --------------------------------------------------------------------


def test_the_compose_file_parses_into_the_whole_topology():
    names = set(services())
    assert {
        "kafka-1",
        "kafka-2",
        "kafka-3",
        "kafka-init",
        "postgres",
        "redis",
        "toxiproxy",
        "prometheus",
        "alertmanager",
        "grafana",
        "migrate",
        "alertmanager-token",
        *DEPLOYED_ROLES,
    } <= names
    for name, spec in services().items():
        assert "image" in spec or "build" in spec, f"{name} has neither image nor build"


def test_every_variable_named_is_one_the_product_reads():
    named = set(VARIABLE.findall(COMPOSE_FILE.read_text() + DOCKERFILE.read_text()))
    assert named, "compose.yaml names no LEASEWORK_* variable"
    assert named - allowed_variables() - COMPOSE_VARIABLES == set()
    assert not COMPOSE_VARIABLES & allowed_variables()
    for name in COMPOSE_VARIABLES:  # only ever interpolated, never handed to a container
        assert COMPOSE_FILE.read_text().count(name) == COMPOSE_FILE.read_text().count("${" + name)


def test_every_interpolation_has_a_default():
    for name in services():
        environment(name)  # each value: interpolated() fails on a variable without default
    interpolated(COMPOSE_FILE.read_text())


def test_every_dependency_is_a_service_that_starts_first():
    all_services = services()
    for name, spec in all_services.items():
        for dep, condition in depends_on(name).items():
            assert dep in all_services, f"{name} depends on {dep}, which is no service"
            assert condition in CONDITIONS, f"{name} waits for {dep} to be {condition!r}"
            if condition == "service_healthy":
                assert "healthcheck" in all_services[dep], f"{dep} has no healthcheck"
            if condition == "service_completed_successfully":
                assert all_services[dep].get("restart") == "no", f"{dep} is not a one-shot"
            # a service of the default set may not wait for one of an optional profile
            if not spec.get("profiles"):
                assert not all_services[dep].get("profiles"), f"{name} waits for {dep}"
    # no cycle: a start order exists
    left = set(all_services)
    while left:
        ready = {n for n in left if not set(depends_on(n)) & left}
        assert ready, f"a dependency cycle among {sorted(left)}"
        left -= ready


@pytest.mark.parametrize("role", DEPLOYED_ROLES)
def test_each_role_waits_for_migrate_and_the_topics(role):
    waits = depends_on(role)
    assert waits.get("migrate") == "service_completed_successfully"
    assert waits.get("kafka-init") == "service_completed_successfully"
    assert waits.get("postgres") == "service_healthy"
    assert waits.get("redis") == "service_healthy"


def test_migrate_is_a_one_shot_that_runs_migrate_with_settings_that_load():
    assert invocation("migrate") == [EXECUTABLE, "migrate"]
    assert service("migrate")["restart"] == "no"
    assert depends_on("migrate") == {"postgres": "service_healthy"}
    config.load("migrate", environment("migrate"))


@pytest.mark.parametrize("role", DEPLOYED_ROLES)
def test_each_role_runs_its_role_with_settings_that_load(role):
    assert invocation(role) == [EXECUTABLE, role]
    settings = role_settings(role)  # raises ConfigError on a bad value
    assert settings.app is not None or role not in config.APP_ROLES


@pytest.mark.parametrize("role", DEPLOYED_ROLES)
def test_each_role_listens_on_its_ops_port_on_every_interface(role):
    raw = environment(role)["LEASEWORK_OPS_ADDR"]
    assert raw.rpartition(":")[0] in ("", "0.0.0.0"), f"{role} on {raw}: Prometheus cannot reach it"
    assert role_settings(role).ops_addr[1] == ops_port(role)


def real_paths(role: str) -> set[str]:
    if role == "api":
        return {route.path for route in ROUTES if route.method == "GET"}
    return {rule.rule for rule in ops_app(Health(), role).url_map.iter_rules()}


@pytest.mark.parametrize("role", DEPLOYED_ROLES)
def test_healthchecks_ask_readyz_on_the_roles_ops_port(role):
    url = healthcheck_url(role)
    assert url.hostname == "127.0.0.1"
    assert url.port == role_settings(role).ops_addr[1], f"{role}'s healthcheck is on {url.port}"
    assert url.path == "/readyz"
    assert url.path in real_paths(role)
    assert service(role)["healthcheck"]["test"][1] == str(Path(EXECUTABLE).parent / "python")


@pytest.mark.parametrize("role", DEPLOYED_ROLES)
def test_the_stop_grace_period_exceeds_the_drain(role):
    spec = service(role)
    assert spec.get("stop_signal", "SIGTERM") == "SIGTERM"
    grace = config.parse_duration("stop_grace_period", spec.get("stop_grace_period", "10s"))
    drain = role_settings(role).shutdown_timeout
    assert grace >= drain + MARGIN, (
        f"{role}: stop_grace_period={grace}s but LEASEWORK_SHUTDOWN_TIMEOUT={drain}s + {MARGIN}s"
    )
    assert spec.get("restart") in ("unless-stopped", "always", "on-failure")


def test_workers_scale_and_name_themselves_apart():
    worker = service("worker")
    assert "ports" not in worker and "container_name" not in worker, "a fixed port or name"
    assert "LEASEWORK_PROCESS_NAME" not in environment("worker")
    (script,) = worker["entrypoint"][2:]
    assert 'LEASEWORK_PROCESS_NAME="worker-$$HOSTNAME"' in script


def test_every_bind_mount_is_in_the_repository_and_every_volume_is_declared():
    declared = set(compose().get("volumes") or {})
    for name in services():
        for source, target in bind_mounts(name):
            assert source.exists(), f"{name} mounts {source}, which does not exist"
            assert source.is_relative_to(ROOT), f"{name} mounts {source} outside the repository"
            assert target.startswith("/")
        for volume in named_volumes(name):
            assert volume in declared, f"{name} uses volume {volume}, not declared"


# --- the image ------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines, current = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        lines.append(current + line)
        current = ""
    assert not current, "the Dockerfile ends in a continuation"
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def stages() -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(name, base image, instructions) of each stage."""
    found: list[tuple[str, str, list[tuple[str, str]]]] = []
    for instruction, args in dockerfile_instructions():
        if instruction == "FROM":
            match = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", args, re.IGNORECASE)
            assert match, f"FROM {args}: every stage is named"
            found.append((match.group(2), match.group(1), []))
        else:
            assert found, f"{instruction} before the first FROM"
            found[-1][2].append((instruction, args))
    return found


def dockerignored(path: str) -> bool:
    """Whether the build context leaves ``path`` out (.dockerignore: the last match wins; a
    directory pattern covers what is below it)."""
    ignored = False
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate, pattern = line.startswith("!"), line.lstrip("!").rstrip("/")
        parts = Path(path).parts
        candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if pattern.startswith("**/"):
            candidates += ["/".join(parts[i:]) for i in range(len(parts))]
            pattern = pattern[3:]
        if any(fnmatch.fnmatchcase(c, pattern) for c in candidates):
            ignored = not negate
    return ignored


def test_the_dockerfile_builds_the_wheel_then_installs_only_it():
    (build, build_base, build_steps), (runtime, runtime_base, runtime_steps) = stages()
    assert build_base == runtime_base == "python:3.11-slim"
    runs = " ".join(args for instruction, args in build_steps if instruction == "RUN")
    assert re.search(r"\bpip wheel\b.*\s\.(\s|$)|python -m build\b", runs), runs
    installs = " ".join(args for instruction, args in runtime_steps if instruction == "RUN")
    assert "python -m venv /opt/leasework/venv" in installs
    assert re.search(r"/opt/leasework/venv/bin/pip install --no-index .*\bleasework\b", installs)
    copies = [args for instruction, args in runtime_steps if instruction == "COPY"]
    assert copies and all(args.startswith(f"--from={build} ") for args in copies), copies


def test_every_copy_source_exists_and_reaches_the_build_context():
    names = []
    for name, _base, steps in stages():
        for instruction, args in steps:
            if instruction not in ("COPY", "ADD"):
                continue
            words = args.split()
            flags = [w for w in words if w.startswith("--")]
            *sources, _dest = [w for w in words if not w.startswith("--")]
            origin = [f.split("=", 1)[1] for f in flags if f.startswith("--from=")]
            if origin:
                assert origin[0] in names, f"COPY --from={origin[0]}: no earlier stage"
                continue
            for source in sources:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
                assert not dockerignored(source), f"COPY {source}: .dockerignore leaves it out"
        names.append(name)
    for kept in ("pyproject.toml", "leasework/__init__.py", "leasework/migrations/0001_jobs.sql"):
        assert not dockerignored(kept), kept
    for dropped in (".venv/bin/python", ".git/HEAD", "tests/unit/test_compose.py", "reports/x"):
        assert dockerignored(dropped), dropped


def test_the_image_runs_the_wheels_console_script_unprivileged():
    *_, (_name, _base, steps) = stages()
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"leasework": "leasework.cli:main"}
    assert EXECUTABLE == "/opt/leasework/venv/bin/leasework"
    (entrypoint,) = [args for instruction, args in steps if instruction == "ENTRYPOINT"]
    assert json.loads(entrypoint) == [EXECUTABLE]
    users = [args for instruction, args in steps if instruction == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    exposed = {int(p) for i, args in steps if i == "EXPOSE" for p in args.split()}
    assert exposed == {ops_port(role) for role in DEPLOYED_ROLES}


def test_the_services_build_this_image():
    for name in ("migrate", "alertmanager-token", *DEPLOYED_ROLES):
        build = service(name)["build"]
        assert (COMPOSE / build["context"]).resolve() == ROOT
        assert (ROOT / build["dockerfile"]).resolve() == DOCKERFILE
        assert interpolated(service(name)["image"]) == "leasework:0.1.0"


# --- Kafka ----------------------------------------------------------------------------------


def brokers() -> dict[str, dict[str, str]]:
    """service -> environment, of the Kafka nodes."""
    return {
        name: environment(name)
        for name, spec in services().items()
        if spec["image"].startswith("apache/kafka:") and "KAFKA_NODE_ID" in environment(name)
    }


def test_three_combined_kraft_nodes_with_one_quorum_naming_all_three():
    nodes = brokers()
    assert len(nodes) == 3
    ids = {}
    for name, env in nodes.items():
        assert service(name)["image"] == f"apache/kafka:{KAFKA_VERSION}"
        assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
        ids[int(env["KAFKA_NODE_ID"])] = name
        assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{name}:9092"
        assert "CONTROLLER://:9093" in env["KAFKA_LISTENERS"].split(",")
        assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] == "CONTROLLER"
        assert "healthcheck" in service(name)
        assert named_volumes(name).get(name) == env["KAFKA_LOG_DIRS"], f"{name} keeps no data"
    assert len(ids) == 3
    expected_voters = {f"{node}@{name}:9093" for node, name in ids.items()}
    for env in nodes.values():
        assert set(env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")) == expected_voters
    assert len({env["CLUSTER_ID"] for env in nodes.values()}) == 1


def test_kafka_replicates_three_times_and_needs_two_in_sync():
    for env in brokers().values():
        assert env["KAFKA_DEFAULT_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
        assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "2"
        assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"


@pytest.mark.parametrize("role", [*DEPLOYED_ROLES, "migrate"])
def test_leasework_bootstraps_from_every_broker(role):
    listed = set(role_settings(role).kafka_brokers)
    advertised = {
        env["KAFKA_ADVERTISED_LISTENERS"].removeprefix("PLAINTEXT://") for env in brokers().values()
    }
    assert listed == advertised


def created_topics() -> dict[str, dict[str, object]]:
    spec = service("kafka-init")
    script = interpolated(" ".join([*spec["entrypoint"][2:], *spec["command"]]))
    topics = {}
    for line in script.splitlines():
        words = shlex.split(line)
        if "--create" not in words:
            continue
        value = {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}
        configs = dict(
            words[i + 1].split("=", 1) for i, w in enumerate(words[:-1]) if w == "--config"
        )
        assert "--if-not-exists" in words, "a second `up` would fail on an existing topic"
        topics[value["--topic"]] = {
            "partitions": int(value["--partitions"]),
            "replication": int(value["--replication-factor"]),
            "config": configs,
        }
    return topics


def test_kafka_init_creates_the_stacks_topics_once_every_broker_is_healthy():
    assert created_topics() == KAFKA_TOPICS
    assert service("kafka-init")["restart"] == "no"
    assert depends_on("kafka-init") == dict.fromkeys(brokers(), "service_healthy")
    settings = role_settings("relay")
    assert {settings.topic_ready, settings.topic_dlq} == set(KAFKA_TOPICS)


# --- Postgres, Redis, Toxiproxy -------------------------------------------------------------


def test_the_dsn_is_the_postgres_service():
    dsn = urllib.parse.urlsplit(role_settings("api").postgres_dsn)
    env = environment("postgres")
    assert dsn.hostname == "postgres" and (dsn.port or 5432) == 5432
    assert (dsn.username, dsn.password) == (env["POSTGRES_USER"], env["POSTGRES_PASSWORD"])
    assert dsn.path.lstrip("/") == env["POSTGRES_DB"]


def test_redis_keeps_an_append_only_file_and_never_evicts():
    command = service("redis")["command"]
    options = dict(zip(command[1::2], command[2::2], strict=True))
    assert command[0] == "redis-server"
    assert options["--appendonly"] == "yes"
    assert options["--maxmemory-policy"] == "noeviction"
    # the variable, not a Settings attribute: host:port, the redis service (it loads: above)
    host, _, port = environment("worker")["LEASEWORK_REDIS_ADDR"].rpartition(":")
    assert (host, port) == ("redis", "6379")


def test_toxiproxy_is_optional_and_proxies_to_services():
    spec = service("toxiproxy")
    assert spec["profiles"] == ["chaos"]
    proxies = json.loads(host_path("toxiproxy", "/etc/toxiproxy/proxies.json").read_text())
    listens = [proxy["listen"] for proxy in proxies]
    assert len(set(listens)) == len(listens)
    for proxy in proxies:
        assert proxy["upstream"].rpartition(":")[0] in services(), proxy


# --- Prometheus -----------------------------------------------------------------------------


def prometheus_config() -> dict:
    return yaml.safe_load(PROMETHEUS_FILE.read_text())


def test_prometheus_loads_this_config_and_every_rule_file():
    assert host_path("prometheus", "/etc/prometheus/prometheus.yml") == PROMETHEUS_FILE
    loaded = set()
    for pattern in prometheus_config()["rule_files"]:
        path = host_path("prometheus", pattern)
        loaded |= set(path.parent.glob(path.name))
    assert loaded and loaded == set(RULES_DIR.glob("*.yml"))


def scrape_job(name: str) -> dict:
    (job,) = [j for j in prometheus_config()["scrape_configs"] if j["job_name"] == name]
    return job


def instance_label(job: dict, service_name: str, address: str) -> str:
    """The instance label Prometheus gives a target found by DNS, by the job's relabelling."""
    labels = {"__meta_dns_name": service_name, "__address__": address, "instance": address}
    for rule in job.get("relabel_configs", []):
        value = rule.get("separator", ";").join(labels[s] for s in rule["source_labels"])
        match = re.fullmatch(rule["regex"], value)
        if match:
            labels[rule["target_label"]] = re.sub(r"\$(\d+)", r"\\\1", rule["replacement"])
            labels[rule["target_label"]] = match.expand(labels[rule["target_label"]])
    return labels["instance"]


@pytest.mark.parametrize("role", DEPLOYED_ROLES)
def test_prometheus_scrapes_every_replica_of_each_role_on_its_ops_port(role):
    job = scrape_job("leasework")
    ports = {tuple(sd["names"]): sd["port"] for sd in job["dns_sd_configs"]}
    assert ports[(role,)] == role_settings(role).ops_addr[1]
    # the rules pick roles by instance (relay.*, worker.*); replicas get instances of their own
    first = instance_label(job, role, f"172.18.0.5:{ports[(role,)]}")
    second = instance_label(job, role, f"172.18.0.6:{ports[(role,)]}")
    assert re.fullmatch(f"{role}.*", first) and first != second


def test_prometheus_alerts_through_alertmanager_and_watches_it():
    (manager,) = prometheus_config()["alerting"]["alertmanagers"]
    (target,) = manager["static_configs"][0]["targets"]
    assert target == "alertmanager:9093"
    assert scrape_job("alertmanager")["static_configs"][0]["targets"] == [target]
    assert scrape_job("prometheus")["static_configs"][0]["targets"] == ["localhost:9090"]


@needs_promtool
def test_the_prometheus_config_passes_promtool(tmp_path):
    config_text = PROMETHEUS_FILE.read_text()
    for pattern in prometheus_config()["rule_files"]:
        config_text = config_text.replace(pattern, str(host_path("prometheus", pattern)))
    path = tmp_path / "prometheus.yml"
    path.write_text(config_text)
    result = promtool("check", "config", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout + result.stderr


# --- Alertmanager ---------------------------------------------------------------------------


def alertmanager_config() -> dict:
    return yaml.safe_load(ALERTMANAGER_FILE.read_text())


def webhook() -> dict:
    (receiver,) = alertmanager_config()["receivers"]
    (hook,) = receiver["webhook_configs"]
    return hook


def test_alertmanager_routes_as_the_local_stack_does():
    assert host_path("alertmanager", "/etc/alertmanager/alertmanager.yml") == ALERTMANAGER_FILE
    hook = webhook()
    token_file = Path(hook["http_config"]["authorization"]["credentials_file"])
    expected = render_alertmanager_yml(token_file, hook["url"])
    assert alertmanager_config() == yaml.safe_load(expected)


def test_the_webhook_is_the_api_with_the_token_the_token_service_writes():
    url = urllib.parse.urlsplit(webhook()["url"])
    assert url.hostname == "api" and url.port == role_settings("api").ops_addr[1]
    assert url.path == urllib.parse.urlsplit(ALERT_WEBHOOK_URL).path
    assert ("POST", url.path) in {(route.method, route.path) for route in ROUTES}
    token_file = webhook()["http_config"]["authorization"]["credentials_file"]
    token_dir = str(Path(token_file).parent)
    (volume,) = [v for v, target in named_volumes("alertmanager").items() if target == token_dir]
    assert named_volumes("alertmanager-token")[volume] == token_dir
    assert any(
        v.startswith(f"{volume}:") and v.endswith(":ro") for v in service("alertmanager")["volumes"]
    )
    words = invocation("alertmanager-token")
    assert words[1:3] == ["token", "ensure"]
    options = dict(zip(words[3::2], words[4::2], strict=False))
    assert options["--scopes"] == "alerts" and options["--file"] == token_file
    assert depends_on("alertmanager")["alertmanager-token"] == "service_completed_successfully"
    # the token dir exists in the image, so the empty volume takes its owner (leasework)
    assert f"mkdir -p {token_dir}" in DOCKERFILE.read_text()
    assert service("alertmanager")["user"].split(":")[1] == "10001"


def test_the_alertmanager_config_passes_amtool():
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.skip("amtool not on PATH (Debian package prometheus-alertmanager; `just up`)")
    result = subprocess.run(
        [amtool, "check-config", str(ALERTMANAGER_FILE)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- Grafana --------------------------------------------------------------------------------


def test_grafana_is_provisioned_with_the_repositorys_files():
    assert host_path("grafana", "/etc/grafana/provisioning") == GRAFANA_PROVISIONING
    providers = yaml.safe_load((GRAFANA_PROVISIONING / "dashboards" / "leasework.yml").read_text())
    for provider in providers["providers"]:
        folder = host_path("grafana", provider["options"]["path"])
        dashboards = sorted(folder.glob("*.json"))
        assert dashboards, f"{folder} holds no dashboard"
        for path in dashboards:
            assert json.loads(path.read_text())["title"]


def test_grafanas_data_source_is_the_prometheus_service():
    sources = yaml.safe_load((GRAFANA_PROVISIONING / "datasources" / "prometheus.yml").read_text())
    (source,) = sources["datasources"]
    url = urllib.parse.urlsplit(source["url"])
    assert url.hostname == "prometheus" and url.port == 9090
    assert "prometheus" in services()


# --- Docker Compose itself, where it exists -------------------------------------------------


def compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker is None:
        return None
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True)
    return [docker, "compose"] if probe.returncode == 0 else None


def test_docker_compose_accepts_the_file():
    cli = compose_cli()
    if cli is None:
        pytest.skip("no `docker compose` (Compose v2 plugin) here; the file is checked above")
    result = subprocess.run(
        [*cli, "-f", str(COMPOSE_FILE), "--profile", "chaos", "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
