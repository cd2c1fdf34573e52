"""Config: defaults < TOML < EQUEUE_* env < flags, validated with one clear message; addresses."""

from __future__ import annotations

import pytest

from equeue_core.client.address import parse_address
from equeue_core.config import load, parse_delay_levels
from equeue_core.errors import ConfigError


def test_defaults_are_the_documented_ones():
    cfg = load(environ={})
    assert (cfg.host, cfg.port, cfg.store, cfg.transport, cfg.flush) == ("127.0.0.1", 10911, "file", "tcp", "async")
    assert cfg.flush_interval_ms == 500 and cfg.max_body_size == 4 * 1024 * 1024 and cfg.default_queues == 4


def test_file_then_env_then_overrides(tmp_path):
    f = tmp_path / "b.toml"
    f.write_text('store = "lmdb"\nport = 1234\n[store_options.file]\nchunk_size = 4096\n')
    cfg = load(str(f), environ={"EQUEUE_TRANSPORT": "zmq", "EQUEUE_PORT": "2345"}, overrides={"flush": "sync"})
    assert (cfg.store, cfg.transport, cfg.port, cfg.flush) == ("lmdb", "zmq", 2345, "sync")
    assert cfg.store_options["file"]["chunk_size"] == 4096


@pytest.mark.parametrize("env,match", [
    ({"EQUEUE_PORT": "http"}, "port"),
    ({"EQUEUE_FLUSH": "sometimes"}, "flush"),
    ({"EQUEUE_AUTO_CREATE_TOPICS": "maybe"}, "auto_create_topics"),
    ({"EQUEUE_DELAY_LEVELS": "1s 2parsecs"}, "duration"),
    ({"EQUEUE_MAX_BODY_SIZE": str(64 << 20)}, "max_body_size"),
])
def test_bad_values_fail_with_a_message_naming_the_key(env, match):
    with pytest.raises(ConfigError, match=match):
        load(environ=env)


def test_unknown_key_in_file_is_an_error(tmp_path):
    f = tmp_path / "b.toml"
    f.write_text("prot = 1\n")
    with pytest.raises(ConfigError, match="prot"):
        load(str(f), environ={})


def test_missing_file_is_an_error():
    with pytest.raises(ConfigError, match="does not exist"):
        load("/nonexistent/broker.toml", environ={})


def test_delay_levels_parse():
    assert parse_delay_levels("1s 5s 10s 30s 1m 2h 250ms") == [1000, 5000, 10000, 30000, 60000, 7200000, 250]


@pytest.mark.parametrize("text,expected", [
    ("127.0.0.1:10911", ("tcp", "127.0.0.1", 10911)),
    ("zmq://127.0.0.1:5555", ("zmq", "127.0.0.1", 5555)),
    ("tcp://localhost:1", ("tcp", "localhost", 1)),
    ("127.0.0.1", ("tcp", "127.0.0.1", 10911)),
])
def test_addresses_carry_the_transport_as_scheme(text, expected):
    a = parse_address(text)
    assert (a.transport, a.host, a.port) == expected


@pytest.mark.parametrize("bad", ["", "127.0.0.1:http", "127.0.0.1:70000", "://x:1"])
def test_bad_addresses_are_config_errors(bad):
    with pytest.raises(ConfigError):
        parse_address(bad)
