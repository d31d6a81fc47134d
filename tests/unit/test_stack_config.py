"""Pure config rendering of devstack (no servers)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from devstack.layout import (
    APPS,
    KAFKA_BROKERS,
    KAFKA_WORKER_BROKERS,
    POSTGRES_DSN,
    PROXIES,
    REDIS_ADDR,
    Layout,
    kafka_ports,
)
from devstack.services.alertmanager import render_alertmanager_yml
from devstack.services.apps import (
    app_env,
    carried_over_env,
    stack_env,
    stale_stack_env,
)
from devstack.services.kafka import (
    KafkaNode,
    new_cluster_id,
    render_log4j2,
    render_server_properties,
)
from devstack.services.postgres import postgres_args
from devstack.services.prometheus import render_prometheus_yml, scratch_labels
from devstack.services.redis import render_redis_conf
from devstack.services.toxiproxy import load_proxies, render_proxies, retired_proxies

REPO = Path(__file__).resolve().parents[2]


def props(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def test_port_contract() -> None:
    assert kafka_ports(1) == {
        "proxy": 19092,
        "broker": 19093,
        "controller": 19094,
        "external": 19095,
        "worker-1": 19096,
        "worker-1-proxy": 19097,
        "worker-2": 19098,
        "worker-2-proxy": 19099,
        "secure": 19100,
        "secure-proxy": 19101,
    }
    assert kafka_ports(3)["proxy"] == 39092
    assert kafka_ports(3)["worker-2-proxy"] == 39099
    assert POSTGRES_DSN == "postgresql://leasework:leasework@127.0.0.1:15432/leasework"
    assert REDIS_ADDR == "127.0.0.1:16379"
    assert KAFKA_BROKERS == "127.0.0.1:19092,127.0.0.1:29092,127.0.0.1:39092"
    assert KAFKA_WORKER_BROKERS == {
        "worker-1": "127.0.0.1:19097,127.0.0.1:29097,127.0.0.1:39097",
        "worker-2": "127.0.0.1:19099,127.0.0.1:29099,127.0.0.1:39099",
    }
    assert {n: p for n, (_, p) in APPS.items()} == {
        "api": 8080,
        "relay": 9102,
        "worker-1": 9101,
        "worker-2": 9103,
    }


def test_kafka_properties_advertise_the_proxies_and_keep_internal_traffic_direct() -> None:
    p = props(render_server_properties(2, Path("/s/kafka-2/data"), Path("/s/tls")))
    assert p["node.id"] == "2"
    assert p["process.roles"] == "broker,controller"
    assert p["controller.quorum.voters"] == (
        "1@127.0.0.1:19094,2@127.0.0.1:29094,3@127.0.0.1:39094"
    )
    assert p["listeners"] == (
        "BROKER://127.0.0.1:29093,CONTROLLER://127.0.0.1:29094,EXTERNAL://127.0.0.1:29095,"
        "WORKER_1://127.0.0.1:29096,WORKER_2://127.0.0.1:29098,SECURE://127.0.0.1:29100"
    )
    # each client listener advertises its own toxiproxy address: a client stays on the
    # proxy it bootstrapped through
    assert p["advertised.listeners"] == (
        "BROKER://127.0.0.1:29093,EXTERNAL://127.0.0.1:29092,WORKER_1://127.0.0.1:29097,"
        "WORKER_2://127.0.0.1:29099,SECURE://127.0.0.1:29101"
    )
    assert p["listener.security.protocol.map"] == (
        "BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT,EXTERNAL:PLAINTEXT,WORKER_1:PLAINTEXT,"
        "WORKER_2:PLAINTEXT,SECURE:SASL_SSL"
    )
    # the secured listener: TLS with the stack's certificate, SCRAM and PLAIN users
    assert p["listener.name.secure.ssl.keystore.type"] == "PEM"
    assert p["listener.name.secure.ssl.keystore.location"] == "/s/tls/server-bundle.pem"
    assert p["listener.name.secure.sasl.enabled.mechanisms"] == "SCRAM-SHA-512,PLAIN"
    assert "ScramLoginModule required;" in p["listener.name.secure.scram-sha-512.sasl.jaas.config"]
    assert 'user_leasework="' in p["listener.name.secure.plain.sasl.jaas.config"]
    assert p["inter.broker.listener.name"] == "BROKER"
    assert p["controller.listener.names"] == "CONTROLLER"
    assert p["log.dirs"] == "/s/kafka-2/data"
    for key, value in {
        "default.replication.factor": "3",
        "min.insync.replicas": "2",
        "offsets.topic.replication.factor": "3",
        "offsets.topic.num.partitions": "12",
        "transaction.state.log.replication.factor": "3",
        "transaction.state.log.min.isr": "2",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "false",
        "num.network.threads": "1",
        "num.io.threads": "2",
    }.items():
        assert p[key] == value, key


def test_kafka_proxies_point_at_the_external_and_each_workers_listener() -> None:
    for n in (1, 2, 3):
        listen, upstream = PROXIES[f"kafka-{n}"]
        assert listen == kafka_ports(n)["proxy"]
        assert upstream == kafka_ports(n)["external"]
        assert PROXIES[f"kafka-{n}-worker-1"] == (n * 10000 + 9097, n * 10000 + 9096)
        assert PROXIES[f"kafka-{n}-worker-2"] == (n * 10000 + 9099, n * 10000 + 9098)


def test_every_listener_and_proxy_is_consistent_for_every_node() -> None:
    for n in (1, 2, 3):
        p = props(render_server_properties(n, Path(f"/s/kafka-{n}/data"), Path("/s/tls")))
        listeners = dict(item.split("://") for item in p["listeners"].split(","))
        advertised = dict(item.split("://") for item in p["advertised.listeners"].split(","))
        protocols = dict(item.split(":") for item in p["listener.security.protocol.map"].split(","))
        clients = {"EXTERNAL": f"kafka-{n}", "WORKER_1": f"kafka-{n}-worker-1"}
        clients["WORKER_2"] = f"kafka-{n}-worker-2"
        clients["SECURE"] = f"kafka-{n}-secure"
        assert set(listeners) == set(protocols) == {"BROKER", "CONTROLLER", *clients}
        assert set(advertised) == {"BROKER", *clients}
        # the client listeners are reached only through their proxies
        for name, proxy in clients.items():
            listen, upstream = PROXIES[proxy]
            assert listeners[name] == f"127.0.0.1:{upstream}"
            assert advertised[name] == f"127.0.0.1:{listen}"
        assert advertised["BROKER"] == listeners["BROKER"]
        ports = [int(a.rsplit(":", 1)[1]) for a in listeners.values()]
        assert len(set(ports)) == len(ports)
    every_port = [port for n in (1, 2, 3) for port in kafka_ports(n).values()]
    assert len(set(every_port)) == len(every_port)


def test_kafka_node_config_is_stale_until_rewritten(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "st", tmp_path / "c", REPO)
    node = KafkaNode(layout, 1)
    assert node.config_stale()  # never written
    node.properties.parent.mkdir(parents=True)
    old = node.rendered_properties().replace(",WORKER_2://127.0.0.1:19098", "")
    node.properties.write_text(old)
    assert node.config_stale() and node.stale(0) == ["server.properties"]
    node.properties.write_text(node.rendered_properties())
    assert not node.config_stale() and node.stale(0) == []
    assert {19096, 19098} <= set(node.ports())


def test_log4j2_quiets_chatty_loggers() -> None:
    text = render_log4j2("kafka-1")
    assert "rootLogger.level = INFO" in text
    assert "appender.out.target = SYSTEM_OUT" in text
    assert "state.change.logger" in text and "level = WARN" in text


def test_cluster_id_is_kafka_uuid_shaped() -> None:
    for _ in range(50):
        cid = new_cluster_id()
        assert len(cid) == 22 and not cid.startswith("-")
        assert set(cid) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def test_redis_conf() -> None:
    text = render_redis_conf(Path("/s/redis"), Path("/s/tls"))
    lines = set(text.splitlines())
    assert {"tls-port 16382", "tls-cert-file /s/tls/server.pem", "tls-auth-clients optional"} <= (
        lines
    )
    acl = next(line for line in lines if line.startswith("user leasework on >"))
    assert "+@all" in acl and "-flushall" in acl and "-acl" in acl
    assert {"bind 127.0.0.1", "port 16380", "appendonly yes", "appendfsync everysec"} <= lines
    assert "dir /s/redis" in lines
    assert "daemonize no" in lines


def test_postgres_args() -> None:
    args = postgres_args(Path("/s/postgres/data"), Path("/s/postgres"))
    assert args[:2] == ["-D", "/s/postgres/data"]
    settings = dict(a.split("=", 1) for a in args[3::2])
    assert settings["port"] == "15433"
    assert settings["listen_addresses"] == "127.0.0.1"
    assert settings["unix_socket_directories"] == "/s/postgres"
    assert settings["max_connections"] == "200"
    assert settings["fsync"] == "on"
    assert all(a == "-c" for a in args[2::2])


def test_prometheus_yml_without_and_with_rules() -> None:
    yaml = pytest.importorskip("yaml")
    cfg = yaml.safe_load(render_prometheus_yml([]))
    assert cfg["global"]["scrape_interval"] == "2s"
    assert cfg["global"]["evaluation_interval"] == "2s"
    assert cfg["rule_files"] == []
    jobs = {
        job["job_name"]: {sc["labels"]["instance"]: sc["targets"] for sc in job["static_configs"]}
        for job in cfg["scrape_configs"]
    }
    assert jobs == {
        "leasework": {
            "api": ["127.0.0.1:8080"],
            "relay": ["127.0.0.1:9102"],
            "worker-1": ["127.0.0.1:9101"],
            "worker-2": ["127.0.0.1:9103"],
        },
        # the alert path: each Prometheus scrapes itself, and the Alertmanager it sends to
        "prometheus": {"prometheus": ["127.0.0.1:9090"]},
        "alertmanager": {"alertmanager": ["127.0.0.1:9093"]},
    }
    scratch = yaml.safe_load(render_prometheus_yml([], scratch_labels("r"), port=9091))
    (own,) = [job for job in scratch["scrape_configs"] if job["job_name"] == "prometheus"]
    assert own["static_configs"] == [
        {"targets": ["127.0.0.1:9091"], "labels": {"instance": "prometheus"}}
    ]
    cfg = yaml.safe_load(render_prometheus_yml([Path("/r/a.yml"), Path("/r/b.yml")]))
    assert cfg["rule_files"] == ["/r/a.yml", "/r/b.yml"]


def test_every_prometheus_sends_to_the_stacks_alertmanager_saying_which_it_is() -> None:
    yaml = pytest.importorskip("yaml")
    stack = yaml.safe_load(render_prometheus_yml([]))
    (am,) = stack["alerting"]["alertmanagers"]
    assert am["static_configs"] == [{"targets": ["127.0.0.1:9093"]}]
    assert stack["global"]["external_labels"] == {"prometheus": "stack"}
    scratch = yaml.safe_load(render_prometheus_yml([], scratch_labels("run-7")))
    assert scratch["alerting"] == stack["alerting"]
    assert scratch["global"]["external_labels"] == {
        "prometheus": "scratch",
        "scratch_run": "run-7",
    }


def test_alertmanager_routes_everything_to_the_apis_webhook_with_its_token() -> None:
    yaml = pytest.importorskip("yaml")
    layout = Layout(Path("/s"), Path("/c"), REPO)
    cfg = yaml.safe_load(render_alertmanager_yml(layout.alertmanager_token_file))
    route = cfg["route"]
    assert route["receiver"] == "leasework-api"
    assert route["group_by"] == ["..."]  # every alert a notification of its own
    assert (route["group_wait"], route["group_interval"]) == ("1s", "5s")
    # the deadman to the same receiver, on a route of its own: one heartbeat an hour
    (watchdog,) = route["routes"]
    assert watchdog == {
        "matchers": ['alertname="LeaseworkWatchdog"'],
        "receiver": "leasework-api",
        "repeat_interval": "1h",
    }
    (receiver,) = cfg["receivers"]
    assert receiver["name"] == "leasework-api"
    (hook,) = receiver["webhook_configs"]
    assert hook["url"] == "http://127.0.0.1:8080/alerts/webhook"
    assert hook["send_resolved"] is True
    assert hook["http_config"]["authorization"] == {
        "type": "Bearer",
        "credentials_file": "/s/tokens/alertmanager.token",
    }


def test_proxies_json_in_repo_matches_the_port_contract() -> None:
    assert load_proxies(REPO / "toxiproxy" / "proxies.json") == render_proxies()
    names = [p["name"] for p in render_proxies()]
    assert names == [
        "postgres",
        "redis",
        "redis-tls",
        "kafka-1",
        "kafka-2",
        "kafka-3",
        "kafka-1-worker-1",
        "kafka-2-worker-1",
        "kafka-3-worker-1",
        "kafka-1-worker-2",
        "kafka-2-worker-2",
        "kafka-3-worker-2",
        "kafka-1-secure",
        "kafka-2-secure",
        "kafka-3-secure",
    ]
    assert json.loads((REPO / "toxiproxy" / "proxies.json").read_text())[0]["listen"] == (
        "127.0.0.1:15432"
    )


def test_proxies_renamed_away_are_retired_but_the_harness_proxies_are_not() -> None:
    defined = render_proxies()
    running = ["postgres", "kafka-1", "kafka-1-workers", "chaos-worker-1-redis", "kafka-1-worker-1"]
    assert retired_proxies(running, defined) == ["kafka-1-workers"]
    assert retired_proxies([p["name"] for p in defined], defined) == []


def test_app_env_precedence() -> None:
    base = {
        "PATH": "/bin",
        "LEASEWORK_REDIS_ADDR": "127.0.0.1:9999",  # caller override wins over the default
        "LEASEWORK_PROCESS_NAME": "caller",  # identity is always ours
        "LEASEWORK_OPS_ADDR": "127.0.0.1:1",
    }
    env = app_env("worker-2", "127.0.0.1:9103", base, {"LEASEWORK_UNSAFE": "1"})
    assert env["PATH"] == "/bin"
    assert env["LEASEWORK_REDIS_ADDR"] == "127.0.0.1:9999"
    assert env["LEASEWORK_POSTGRES_DSN"] == POSTGRES_DSN
    assert env["LEASEWORK_KAFKA_BROKERS"] == KAFKA_WORKER_BROKERS["worker-2"]
    assert env["LEASEWORK_PROCESS_NAME"] == "worker-2"
    assert env["LEASEWORK_OPS_ADDR"] == "127.0.0.1:9103"
    assert env["LEASEWORK_UNSAFE"] == "1"
    assert base["LEASEWORK_PROCESS_NAME"] == "caller"  # input not mutated
    # extra_env is the explicit, highest-precedence override
    assert (
        app_env("api", "127.0.0.1:8080", {}, {"LEASEWORK_REDIS_ADDR": "x"})["LEASEWORK_REDIS_ADDR"]
        == "x"
    )


def test_secure_mode_points_every_process_at_the_secured_listeners_only() -> None:
    env = app_env("worker-1", "127.0.0.1:9101", {}, None, "secure", Path("/s/tls"))
    assert "LEASEWORK_REDIS_ADDR" not in env
    assert env["LEASEWORK_REDIS_URL"].startswith("rediss://leasework:")
    assert env["LEASEWORK_REDIS_URL"].endswith("@127.0.0.1:16381/0")
    assert env["LEASEWORK_REDIS_CA"] == "/s/tls/ca.pem"
    assert env["LEASEWORK_POSTGRES_DSN"].endswith("?sslmode=verify-full&sslrootcert=/s/tls/ca.pem")
    # both workers and the relay share the secured listeners' proxies
    assert env["LEASEWORK_KAFKA_BROKERS"] == "127.0.0.1:19101,127.0.0.1:29101,127.0.0.1:39101"
    assert env["LEASEWORK_RDKAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert env["LEASEWORK_RDKAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512"
    # what the product makes of it: it loads
    from leasework.config import load

    ca = {"LEASEWORK_REDIS_CA": __file__}  # load() wants an existing file
    settings = load("worker", {**env, **ca})
    assert settings.redis.tls
    assert ("security.protocol", "SASL_SSL") in settings.kafka_properties


def test_switching_mode_makes_a_running_process_stale_both_ways() -> None:
    plain = app_env("relay", "127.0.0.1:9102", {})
    secure = app_env("relay", "127.0.0.1:9102", {}, None, "secure")
    assert "LEASEWORK_REDIS_ADDR" in stale_stack_env(plain, secure)
    assert "LEASEWORK_RDKAFKA_SASL_PASSWORD" in stale_stack_env(secure, plain)
    assert "LEASEWORK_REDIS_URL" in stale_stack_env(secure, plain)
    # nothing of the other mode is carried over into the restart
    assert carried_over_env(secure, plain, stale_stack_env(secure, plain)) == {}
    assert stale_stack_env(secure, secure) == []


def test_layout_from_env(tmp_path: Path) -> None:
    layout = Layout.from_env(
        {"LEASEWORK_STATE_DIR": str(tmp_path / "st"), "LEASEWORK_CACHE_DIR": str(tmp_path / "c")}
    )
    assert layout.pidfile("kafka-1") == tmp_path / "st" / "pids" / "kafka-1.pid"
    assert layout.log("api") == tmp_path / "st" / "logs" / "api.log"
    assert layout.kafka_libs == tmp_path / "c" / "kafka-4.1.1" / "libs"
    assert layout.toxiproxy_bin == tmp_path / "c" / "toxiproxy-2.12.0" / "toxiproxy-server"
    assert layout.kafka_pom.exists()
    default = Layout.from_env({})
    assert default.state_dir == Path("/var/tmp/leasework")


def test_each_worker_gets_kafka_proxies_of_its_own_everyone_else_the_shared_ones() -> None:
    want = {
        "api": "127.0.0.1:19092,127.0.0.1:29092,127.0.0.1:39092",
        "relay": "127.0.0.1:19092,127.0.0.1:29092,127.0.0.1:39092",
        "worker-1": "127.0.0.1:19097,127.0.0.1:29097,127.0.0.1:39097",
        "worker-2": "127.0.0.1:19099,127.0.0.1:29099,127.0.0.1:39099",
    }
    for name, (_role, port) in APPS.items():
        env = app_env(name, f"127.0.0.1:{port}", {})
        assert env["LEASEWORK_KAFKA_BROKERS"] == want[name], name
    assert app_env("migrate", None, {})["LEASEWORK_KAFKA_BROKERS"] == KAFKA_BROKERS
    assert stack_env("worker-2")["LEASEWORK_KAFKA_BROKERS"] == KAFKA_WORKER_BROKERS["worker-2"]
    # an explicit extra_env still wins, for workers as for everyone
    env = app_env("worker-1", "127.0.0.1:9101", {}, {"LEASEWORK_KAFKA_BROKERS": KAFKA_BROKERS})
    assert env["LEASEWORK_KAFKA_BROKERS"] == KAFKA_BROKERS


def test_stale_stack_env_flags_outdated_defaults_but_not_deliberate_overrides() -> None:
    expected = app_env("worker-1", "127.0.0.1:9101", {"PATH": "/bin"})
    # started before workers had their own proxies: the shared default is stale
    running = {**expected, "LEASEWORK_KAFKA_BROKERS": KAFKA_BROKERS, "LEASEWORK_UNSAFE": "1"}
    assert stale_stack_env(running, expected) == ["LEASEWORK_KAFKA_BROKERS"]
    # a restart brings the defaults up to date and keeps what was given on purpose
    stale = stale_stack_env(running, expected)
    assert carried_over_env(running, expected, stale) == {"LEASEWORK_UNSAFE": "1"}
    assert stale_stack_env(expected, expected) == []
    # a value the stack never hands out is somebody's choice, not stale
    private = {**expected, "LEASEWORK_KAFKA_BROKERS": "127.0.0.1:40000"}
    # worker-2 started when both workers shared worker-1's proxies: stale as well
    expected_2 = app_env("worker-2", "127.0.0.1:9103", {"PATH": "/bin"})
    shared = {**expected_2, "LEASEWORK_KAFKA_BROKERS": KAFKA_WORKER_BROKERS["worker-1"]}
    assert stale_stack_env(shared, expected_2) == ["LEASEWORK_KAFKA_BROKERS"]
    assert stale_stack_env(private, expected) == []
    assert carried_over_env(private, expected, []) == {"LEASEWORK_KAFKA_BROKERS": "127.0.0.1:40000"}
    # the relay with the shared proxies is up to date
    relay = app_env("relay", "127.0.0.1:9102", {})
    assert stale_stack_env(relay, relay) == []


@pytest.mark.parametrize(
    ("tool", "args", "render"),
    [
        ("amtool", ("check-config",), lambda: render_alertmanager_yml(Path("/s/am.token"))),
        ("promtool", ("check", "config"), lambda: render_prometheus_yml([])),
        (
            "promtool",
            ("check", "config"),
            lambda: render_prometheus_yml([], scratch_labels("r1")),
        ),
    ],
)
def test_the_rendered_configs_pass_their_servers_own_check(tool, args, render, tmp_path) -> None:
    binary = shutil.which(tool)
    if binary is None:
        pytest.skip(f"{tool} not on PATH (`just up` provisions it)")
    path = tmp_path / "config.yml"
    path.write_text(render())
    result = subprocess.run([binary, *args, str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_stack_ports_in_the_ephemeral_range_are_reserved() -> None:
    from devstack.provision import reserved_ports_value, stack_ports

    ports = stack_ports()
    assert {39092, 39101, 16382, 8080} <= ports
    value = reserved_ports_value("", (32768, 60999), ports)
    assert value.split(",")[0] == "39092" and "39101" in value.split(",")
    assert "16382" not in value.split(",")  # below the range: never a source port
    # what someone else reserved stays, nothing twice
    assert reserved_ports_value("50000,39092", (32768, 60999), {39092, 39093}) == (
        "50000,39092,39093"
    )
