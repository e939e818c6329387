"""The Redis channel's options: a malformed ``redis_url`` is refused by the decoupled run's pre-flight
(:func:`tandem.channels.check_channel`) as one line naming the key, before any connection or run folder."""

from __future__ import annotations

import pytest

from tandem.channels import check_channel
from tandem.channels.redis import shown_url, url_problem
from tandem.errors import ConfigError

KEY = "architecture.channel.options.redis_url"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("notaurl", "'notaurl' is not a Redis URL; use redis://"),
        ("http://127.0.0.1:6379/0", "is not a Redis URL"),
        ("redis://127.0.0.1:99999/0", "bad port in 'redis://127.0.0.1:99999/0' (Port out of range 0-65535)"),
        ("redis://127.0.0.1:port/0", "bad port"),
        ("redis://127.0.0.1:6379/abc", "database 'abc' in 'redis://127.0.0.1:6379/abc' is not a number"),
        ("redis://127.0.0.1:6379/-1", "database '-1'"),
        ("redis://127.0.0.1:6379?db=x", "database 'x'"),
    ],
)
def test_malformed_redis_url_is_one_config_error_line(url, says):
    with pytest.raises(ConfigError) as info:
        check_channel("redis", {"redis_url": url}, "embedded")
    message = str(info.value)
    assert message.startswith(f"{KEY}: ") and says in message, message
    assert "\n" not in message and "Value error" not in message


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "redis://h",
        "rediss://:pw@h:6380/2",
        "unix:///tmp/redis.sock",
        "redis://h/0?db=3",
    ],
)
def test_well_formed_redis_urls_pass_without_a_server(url):
    assert url_problem(url) is None
    assert check_channel("redis", {"redis_url": url}, "embedded").redis_url == url


def test_a_password_never_appears_in_a_message():
    assert shown_url("redis://user:s3cret@h:6379/0") == "redis://user:***@h:6379/0"
    assert shown_url("redis://h:6379/0") == "redis://h:6379/0"
    with pytest.raises(ConfigError) as info:
        check_channel("redis", {"redis_url": "redis://:s3cret@h:6379/nope"}, "embedded")
    assert "s3cret" not in str(info.value) and "redis://:***@h:6379/nope" in str(info.value)
