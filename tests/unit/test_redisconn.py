"""Where Redis is: the URL forms leasework takes, the settings that make one, and what a client
made from each would do (no connection is opened: redis-py connects on the first command)."""

import pytest

from leasework.config import ConfigError, effective, load
from leasework.redisconn import RedisTarget, RedisURLError, check_url, connect


def kwargs(client) -> dict:
    return client.connection_pool.connection_kwargs


def test_the_short_form_is_a_plain_url():
    assert load("relay", {"LEASEWORK_REDIS_ADDR": "r:1"}).redis_url == "redis://r:1/0"
    assert load("relay", {}).redis == RedisTarget()


def test_a_url_with_an_acl_user_tls_and_a_ca(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    settings = load(
        "relay",
        {
            "LEASEWORK_REDIS_URL": "rediss://leasework:s%40cret@redis.internal:6380/2",
            "LEASEWORK_REDIS_CA": str(ca),
        },
    )
    target = settings.redis
    assert target.tls and target.ca_file == str(ca)
    assert target.describe() == "rediss://leasework@redis.internal:6380"
    client = connect(target, timeout=2)
    got = kwargs(client)
    assert (got["username"], got["password"]) == ("leasework", "s@cret")
    assert (got["host"], got["port"], got["db"]) == ("redis.internal", 6380, 2)
    assert got["ssl_ca_certs"] == str(ca)
    assert got["ssl_cert_reqs"] == "required" and got["ssl_check_hostname"] is True
    assert got["socket_timeout"] == 2
    assert client.connection_pool.connection_class.__name__ == "SSLConnection"


def test_a_plain_url_is_not_tls():
    client = connect(RedisTarget("redis://:pw@h:7/0"), timeout=1)
    assert client.connection_pool.connection_class.__name__ == "Connection"
    assert kwargs(client)["password"] == "pw"


def test_sentinels_name_the_primary():
    settings = load(
        "worker",
        {
            "LEASEWORK_APP": "leasework.demo:app",
            "LEASEWORK_REDIS_URL": "rediss://leasework:pw@ignored:1/0",
            "LEASEWORK_REDIS_SENTINELS": "s1:26379, s2:26380",
            "LEASEWORK_REDIS_SENTINEL_MASTER": "jobs",
            "LEASEWORK_REDIS_SENTINEL_PASSWORD": "spw",
        },
    )
    target = settings.redis
    assert target.sentinels == (("s1", 26379), ("s2", 26380))
    assert "primary 'jobs' of Sentinels s1:26379,s2:26380" in target.describe()
    client = connect(target, timeout=3)
    pool = client.connection_pool
    assert pool.service_name == "jobs"
    assert pool.connection_class.__name__ == "SentinelManagedSSLConnection"
    assert (pool.connection_kwargs["username"], pool.connection_kwargs["password"]) == (
        "leasework",
        "pw",
    )
    sentinel = pool.sentinel_manager.sentinels[0].connection_pool.connection_kwargs
    assert sentinel["password"] == "spw" and sentinel["host"] == "s1"


def test_url_and_short_form_together_are_refused():
    with pytest.raises(ConfigError, match="both set"):
        load("relay", {"LEASEWORK_REDIS_URL": "redis://a:1/0", "LEASEWORK_REDIS_ADDR": "a:1"})


def test_a_refused_url_does_not_echo_its_password():
    with pytest.raises(ConfigError) as refused:
        load("relay", {"LEASEWORK_REDIS_URL": "redis://u:hunter2@h:1/x"})
    assert "hunter2" not in str(refused.value)


@pytest.mark.parametrize("url", ["redis://h:6379", "rediss://u:p@h/0", "redis://h:1/15"])
def test_urls_leasework_takes(url):
    assert check_url(url) == url


@pytest.mark.parametrize("url", ["h:6379", "redis:///0", "unix:///tmp/r.sock"])
def test_urls_leasework_refuses(url):
    with pytest.raises(RedisURLError):
        check_url(url)


def test_leasework_config_masks_redis_passwords():
    rows = {
        name: (value, source)
        for name, value, source in effective(
            "relay",
            {
                "LEASEWORK_REDIS_URL": "rediss://leasework:hunter2@h:6380/0",
                "LEASEWORK_REDIS_SENTINEL_PASSWORD": "hunter3",
            },
        )
    }
    assert rows["redis_url"] == ("rediss://leasework:***@h:6380/0", "env")
    assert rows["redis_sentinel_password"] == ("***", "env")
    short = dict((n, s) for n, _, s in effective("relay", {"LEASEWORK_REDIS_ADDR": "h:1"}))
    assert short["redis_url"] == "env"
