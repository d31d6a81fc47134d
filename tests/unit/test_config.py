import os

import pytest

from leasework import config
from leasework.config import ConfigError, parse_duration

APP = {"LEASEWORK_APP": "leasework.demo:app"}


def load(role, environ):
    """The roles that run job types need an app; the tests give them the demo app."""
    return config.load(role, {**APP, **environ})


def test_defaults_follow_the_seed_ports():
    assert load("api", {}).ops_addr == ("127.0.0.1", 8080)
    assert load("worker", {}).ops_addr == ("127.0.0.1", 9101)
    assert load("relay", {}).ops_addr == ("127.0.0.1", 9102)
    # dev answers where the api does, so the CLI and leasework.Client() find it
    assert load("dev", {}).ops_addr == load("api", {}).ops_addr
    from leasework.client import DEFAULT_URL

    assert DEFAULT_URL.startswith("http://127.0.0.1:8080") or "LEASEWORK_API_URL" in os.environ


@pytest.mark.parametrize("role", ["api", "worker", "dev"])
def test_the_roles_that_run_job_types_refuse_to_start_without_an_app(role):
    with pytest.raises(ConfigError, match="LEASEWORK_APP is not set.*--app mypkg.jobs:app"):
        config.load(role, {})
    assert config.load("relay", {}).app is None  # the relay runs no job code


def test_retention_takes_durations_or_never():
    settings = load("relay", {"LEASEWORK_RETAIN_SUCCEEDED": "2d", "LEASEWORK_RETAIN_DEAD": "never"})
    assert settings.retain_succeeded == 2 * 86400 and settings.retain_dead is None
    with pytest.raises(ConfigError, match="LEASEWORK_RETAIN_CANCELLED='0'.*'never'"):
        load("relay", {"LEASEWORK_RETAIN_CANCELLED": "0"})


def test_the_audit_log_and_alert_notifications_have_a_retention_of_their_own():
    defaults = load("relay", {})
    assert defaults.retain_audit == 90 * 86400 and defaults.retain_alerts == 30 * 86400
    settings = load("relay", {"LEASEWORK_RETAIN_AUDIT": "never", "LEASEWORK_RETAIN_ALERTS": "12h"})
    assert settings.retain_audit is None and settings.retain_alerts == 12 * 3600
    assert load("relay", {"LEASEWORK_RETAIN_AUDIT": "Forever"}).retain_audit is None
    with pytest.raises(ConfigError, match="LEASEWORK_RETAIN_AUDIT='0d'.*'never'"):
        load("relay", {"LEASEWORK_RETAIN_AUDIT": "0d"})
    with pytest.raises(ConfigError, match="LEASEWORK_RETAIN_ALERTS='a month' is not a duration"):
        load("relay", {"LEASEWORK_RETAIN_ALERTS": "a month"})


def test_reads_every_documented_variable():
    settings = load(
        "worker",
        {
            "LEASEWORK_LOG_LEVEL": "DEBUG",
            "LEASEWORK_OPS_ADDR": ":9200",
            "LEASEWORK_POSTGRES_DSN": "postgresql://u:p@h:1/db",
            "LEASEWORK_REDIS_ADDR": "10.0.0.1:6380",
            "LEASEWORK_KAFKA_BROKERS": "a:1, b:2",
            "LEASEWORK_SHUTDOWN_TIMEOUT": "1.5m",
            "LEASEWORK_WORKER_CONCURRENCY": "3",
            "LEASEWORK_PROMETHEUS_URL": "http://prom.internal:9090/",
        },
    )
    assert settings.log_level == "debug"
    assert settings.ops_addr == ("0.0.0.0", 9200)
    assert settings.redis_url == "redis://10.0.0.1:6380/0"
    assert settings.redis.describe() == "redis://10.0.0.1:6380"
    assert settings.kafka_brokers == ("a:1", "b:2")
    assert settings.shutdown_timeout == 90.0
    assert settings.worker_concurrency == 3
    assert settings.prometheus_url == "http://prom.internal:9090"
    assert load("api", {}).prometheus_url == "http://127.0.0.1:9090"


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("LEASEWORK_LOG_LEVEL", "loud", "LEASEWORK_LOG_LEVEL='loud' is not one of"),
        ("LEASEWORK_OPS_ADDR", "9101", "is not host:port"),
        ("LEASEWORK_REDIS_ADDR", "redis:99999", "is not host:port"),
        ("LEASEWORK_REDIS_URL", "http://redis:6379", "is not a redis:// or rediss:// URL"),
        ("LEASEWORK_REDIS_URL", "redis://redis:port", "a port that is not a number"),
        ("LEASEWORK_REDIS_URL", "redis://redis:6379/zero", "must be a database number"),
        ("LEASEWORK_REDIS_URL", "rediss://redis:6379?ssl_ca_certs=x", "LEASEWORK_REDIS_CA"),
        ("LEASEWORK_REDIS_CA", "/no/such/ca.pem", "is not a file"),
        ("LEASEWORK_REDIS_SENTINELS", "s1:26379,s2", "is not host:port"),
        ("LEASEWORK_KAFKA_BROKERS", " , ", "LEASEWORK_KAFKA_BROKERS is empty"),
        ("LEASEWORK_SHUTDOWN_TIMEOUT", "soon", "is not a duration"),
        ("LEASEWORK_SHUTDOWN_TIMEOUT", "0s", "must be greater than zero"),
        ("LEASEWORK_WORKER_CONCURRENCY", "0", "out of range"),
        ("LEASEWORK_POSTGRES_DSN", "localhost", "neither a postgresql:// URL"),
        ("LEASEWORK_APP", "", "LEASEWORK_APP is not set"),
        ("LEASEWORK_PROMETHEUS_URL", "127.0.0.1:9090", "is not an http:// or https:// URL"),
    ],
)
def test_invalid_values_are_rejected_with_the_variable_named(variable, value, message):
    with pytest.raises(ConfigError, match=message):
        load("worker", {variable: value})


def test_durations():
    assert parse_duration("X", "500ms") == 0.5
    assert parse_duration("X", "20") == 20.0
    assert parse_duration("X", "2h") == 7200.0
    assert parse_duration("X", "7d") == 7 * 86400.0


def test_unsafe_lease_mode_is_refused_without_the_explicit_flag():
    with pytest.raises(ConfigError, match="I_ACCEPT_DUPLICATE_EFFECTS"):
        load("worker", {"LEASEWORK_LEASE_MODE": "unsafe-plain-ttl"})
    unsafe = load(
        "worker",
        {
            "LEASEWORK_LEASE_MODE": "unsafe-plain-ttl",
            "LEASEWORK_I_ACCEPT_DUPLICATE_EFFECTS": "yes",
        },
    )
    assert unsafe.lease_mode == "unsafe-plain-ttl"
    assert load("worker", {}).lease_mode == "fenced"


def test_the_unsafe_scheduler_is_refused_without_its_confirmation():
    for value in ("1", "true", "yes"):
        with pytest.raises(ConfigError, match="LEASEWORK_I_ACCEPT_DOUBLE_TICKS=yes"):
            load("relay", {"LEASEWORK_UNSAFE_SCHEDULER": value})
    with pytest.raises(ConfigError, match="I_ACCEPT_DOUBLE_TICKS"):  # only "yes" confirms
        load(
            "relay",
            {"LEASEWORK_UNSAFE_SCHEDULER": "1", "LEASEWORK_I_ACCEPT_DOUBLE_TICKS": "true"},
        )
    unsafe = load(
        "relay", {"LEASEWORK_UNSAFE_SCHEDULER": "1", "LEASEWORK_I_ACCEPT_DOUBLE_TICKS": "yes"}
    )
    assert unsafe.unsafe_scheduler is True
    assert load("relay", {}).unsafe_scheduler is False
    assert load("relay", {"LEASEWORK_UNSAFE_SCHEDULER": "0"}).unsafe_scheduler is False
    # the confirmation alone turns nothing off
    assert load("relay", {"LEASEWORK_I_ACCEPT_DOUBLE_TICKS": "yes"}).unsafe_scheduler is False
    with pytest.raises(ConfigError, match="not a boolean"):
        load("relay", {"LEASEWORK_UNSAFE_SCHEDULER": "maybe"})
    # an environment switch only: a configuration file cannot hold it
    assert "unsafe_scheduler" not in config.known_keys()


def test_what_a_request_may_cost_and_whom_to_trust_are_configurable():
    import ipaddress

    defaults = config.load("api", {"LEASEWORK_APP": "m:a"})
    assert (defaults.max_form_bytes, defaults.max_small_body_bytes) == (8192, 65536)
    assert defaults.body_read_timeout == 10.0 and defaults.trusted_proxies == ()
    assert defaults.internal_addr is None
    settings = config.load(
        "api",
        {
            "LEASEWORK_APP": "m:a",
            "LEASEWORK_MAX_FORM_BYTES": "4096",
            "LEASEWORK_MAX_WEBHOOK_BYTES": "100000",
            "LEASEWORK_BODY_READ_TIMEOUT": "3s",
            "LEASEWORK_TRUSTED_PROXIES": "127.0.0.1, 10.0.0.0/8,::1",
            "LEASEWORK_INTERNAL_ADDR": "127.0.0.1:9180",
        },
    )
    assert settings.max_form_bytes == 4096 and settings.max_webhook_bytes == 100000
    assert settings.body_read_timeout == 3.0
    assert ipaddress.ip_address("10.9.8.7") in settings.trusted_proxies[1]
    assert settings.internal_addr == ("127.0.0.1", 9180)
    with pytest.raises(ConfigError, match="LEASEWORK_TRUSTED_PROXIES.*'nope'"):
        config.load("api", {"LEASEWORK_APP": "m:a", "LEASEWORK_TRUSTED_PROXIES": "nope"})
    with pytest.raises(ConfigError, match="LEASEWORK_MAX_FORM_BYTES"):
        config.load("api", {"LEASEWORK_APP": "m:a", "LEASEWORK_MAX_FORM_BYTES": "10"})


def test_a_configuration_file_is_read_and_a_variable_wins(tmp_path):
    from leasework.config import load

    path = tmp_path / "leasework.toml"
    path.write_text(
        'postgres_dsn = "postgresql://a:b@db/lw"\nlease_ttl = "20s"\n'
        'kafka_brokers = ["k1:9092", "k2:9092"]\nworker_concurrency = 8\n'
    )
    settings = load("relay", {"LEASEWORK_CONFIG": str(path), "LEASEWORK_LEASE_TTL": "30s"})
    assert settings.postgres_dsn == "postgresql://a:b@db/lw"
    assert settings.kafka_brokers == ("k1:9092", "k2:9092")
    assert settings.worker_concurrency == 8
    assert settings.lease_ttl == 30.0  # the variable, not the file


def test_a_configuration_file_with_an_unknown_key_or_bad_toml_is_refused(tmp_path):
    from leasework.config import load

    path = tmp_path / "leasework.toml"
    path.write_text('postgres_dns = "typo"\n')
    with pytest.raises(ConfigError, match="unknown key.*postgres_dns.*postgres_dsn"):
        load("relay", {"LEASEWORK_CONFIG": str(path)})
    path.write_text("lease_ttl = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load("relay", {"LEASEWORK_CONFIG": str(path)})
    with pytest.raises(ConfigError, match="cannot be read"):
        load("relay", {"LEASEWORK_CONFIG": str(tmp_path / "missing.toml")})
    path.write_text('lease_ttl = "0s"\n')  # the file's values are checked like variables
    with pytest.raises(ConfigError, match="LEASEWORK_LEASE_TTL"):
        load("relay", {"LEASEWORK_CONFIG": str(path)})


def test_the_effective_configuration_says_where_each_setting_came_from_and_masks_secrets(
    tmp_path,
):
    from leasework.config import effective

    path = tmp_path / "leasework.toml"
    path.write_text('postgres_dsn = "postgresql://lw:hunter2@db/lw"\n')
    rows = {
        name: (value, source)
        for name, value, source in effective(
            "relay", {"LEASEWORK_CONFIG": str(path), "LEASEWORK_LEASE_TTL": "30s"}
        )
    }
    assert rows["postgres_dsn"] == ("postgresql://lw:***@db/lw", str(path))
    assert rows["lease_ttl"] == ("30.0", "env")
    assert rows["relay_tick"][1] == "default"
    assert "hunter2" not in repr(rows)


def test_passwords_are_masked_in_urls_and_connection_strings():
    from leasework.config import masked

    assert masked("postgresql://u:p%40ss@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert masked("rediss://default:pw@h:6380/0") == "rediss://default:***@h:6380/0"
    assert masked("host=h password='a b' user=u") == "host=h password=*** user=u"
    assert masked("host=h user=u") == "host=h user=u"


def test_librdkafka_properties_pass_through_to_every_kafka_client():
    from leasework.kafka import producer_config
    from leasework.worker.feed import consumer_config

    settings = load(
        "worker",
        {
            "LEASEWORK_RDKAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "LEASEWORK_RDKAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "LEASEWORK_RDKAFKA_SASL_PASSWORD": "hunter2",
            "LEASEWORK_RDKAFKA_SSL_CA_LOCATION": "/etc/ca.pem",
            "LEASEWORK_RDKAFKA_FETCH_WAIT_MAX_MS": "100",  # a tuning knob may be changed
        },
    )
    extra = dict(settings.kafka_properties)
    assert extra["security.protocol"] == "SASL_SSL"
    assert extra["ssl.ca.location"] == "/etc/ca.pem"
    consumer = consumer_config(settings)
    assert consumer["sasl.mechanism"] == "SCRAM-SHA-512"
    assert consumer["fetch.wait.max.ms"] == "100"
    assert consumer["enable.auto.offset.store"] is False  # what the promise rests on stays
    producer = producer_config(settings.kafka_brokers, "relay", settings.kafka_properties)
    assert producer["security.protocol"] == "SASL_SSL"
    assert producer["acks"] == "all" and producer["enable.idempotence"] is True
    rows = {
        name: value
        for name, value, _ in config.effective(
            "worker", {**APP, **{"LEASEWORK_RDKAFKA_SASL_PASSWORD": "hunter2"}}
        )
    }
    assert "sasl.password=***" in rows["kafka_properties"] and "hunter2" not in repr(rows)


@pytest.mark.parametrize(
    "variable",
    [
        "LEASEWORK_RDKAFKA_ACKS",
        "LEASEWORK_RDKAFKA_ENABLE_IDEMPOTENCE",
        "LEASEWORK_RDKAFKA_ENABLE_AUTO_OFFSET_STORE",
        "LEASEWORK_RDKAFKA_BOOTSTRAP_SERVERS",
    ],
)
def test_a_librdkafka_property_the_promise_rests_on_is_refused(variable):
    with pytest.raises(ConfigError, match=f"{variable} would set"):
        load("relay", {variable: "1"})


def test_a_double_underscore_is_a_literal_underscore_in_the_property():
    from leasework.config import rdkafka_property

    assert rdkafka_property("LEASEWORK_RDKAFKA_SSL_KEY__PASSWORD") == "ssl.key_password"
    assert rdkafka_property("LEASEWORK_RDKAFKA_SASL_USERNAME") == "sasl.username"
