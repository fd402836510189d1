"""One `listen:` type and one `--listen` parser for the agent and the aggregator."""

from __future__ import annotations

import pytest

from podhealth import config
from podhealth.config_listen import ListenConfig
from podhealth.netaddr import parse_listen


def test_agent_and_aggregator_share_one_listen_type_with_their_own_defaults() -> None:
    cfg = config.Config()
    assert type(cfg.listen) is type(cfg.aggregator.listen) is ListenConfig
    assert (cfg.listen.address, cfg.listen.port) == ("0.0.0.0", 9410)
    assert (cfg.aggregator.listen.address, cfg.aggregator.listen.port) == ("127.0.0.1", 9420)


def test_a_section_that_sets_one_key_keeps_the_other_from_its_field_default() -> None:
    cfg = config.loads("listen:\n  port: 9500\naggregator:\n  listen:\n    port: 9000\n"
                       "collectors:\n  edac:\n    enabled: false\n", "t.yaml")
    assert (cfg.listen.address, cfg.listen.port) == ("0.0.0.0", 9500)
    # Not the agent's 0.0.0.0: a port-only aggregator section must not open ingest to the network.
    assert (cfg.aggregator.listen.address, cfg.aggregator.listen.port) == ("127.0.0.1", 9000)
    assert cfg.collectors.edac.interval == 30.0 and not cfg.collectors.edac.enabled  # edac's own default


def test_an_empty_section_is_the_field_default() -> None:
    cfg = config.loads("aggregator:\n  listen:\n", "t.yaml")
    assert (cfg.aggregator.listen.address, cfg.aggregator.listen.port) == ("127.0.0.1", 9420)


@pytest.mark.parametrize("text, any_host, want", [
    ("127.0.0.1:9410", None, ("127.0.0.1", 9410)), ("[::1]:0", None, ("::1", 0)),
    ("9000", "0.0.0.0", ("0.0.0.0", 9000)), (":80", "0.0.0.0", ("0.0.0.0", 80)),
    ("[::1]:9", "0.0.0.0", ("::1", 9)),
])
def test_parse_listen(text: str, any_host: str | None, want: tuple[str, int]) -> None:
    assert parse_listen(text, any_host) == want


@pytest.mark.parametrize("text, any_host, says", [
    ("9410", None, "missing address"), (":9410", None, "missing address"), ("host:", "0.0.0.0", "expected ADDR:PORT"),
    ("host:70000", None, "expected ADDR:PORT"), ("x:y", "0.0.0.0", "expected ADDR:PORT"),
])
def test_parse_listen_refuses_with_the_flag_named(text: str, any_host: str | None, says: str) -> None:
    with pytest.raises(ValueError, match=f"--listen: {says}"):
        parse_listen(text, any_host)
