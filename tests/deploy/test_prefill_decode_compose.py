"""deploy/docker-compose.prefill-decode.yml validates, and its two services make one prefill/decode
pair: docker-compose's own `config` check, then tgserve's own `serve` parser and settings fed each
service's command and environment (the oracle of what each process would run with): one
prefill and one decode role, both at the same K/V transfer address on the decode host, the
decode service's --prefill-url pointing at the prefill service's host and HTTP port, and only
the decode service published to clients.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import yaml

from server.cli import build_parser
from server.settings import Settings
from tests.deploy.docker_host import compose_config_errors
from tests.deploy.test_manifests import VERSION

COMPOSE = Path(__file__).resolve().parents[2] / "deploy" / "docker-compose.prefill-decode.yml"


def _settings(service: dict) -> Settings:
    parsed = build_parser("serve").parse_args(["serve", *service["command"]])
    return Settings.resolve(parsed, service["environment"])


def test_the_compose_file_validates_and_pairs_a_prefill_with_a_decode_service() -> None:
    assert compose_config_errors(COMPOSE) == ""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    settings = {name: _settings(service) for name, service in services.items()}
    assert {name: s.role for name, s in settings.items()} == {
        "decode": "decode",
        "prefill": "prefill",
    }
    decode, prefill = settings["decode"], settings["prefill"]
    assert decode.kv_transfer_addr == prefill.kv_transfer_addr
    assert decode.kv_transfer_addr.rpartition(":")[0] == services["decode"]["hostname"]
    url = urlsplit(decode.prefill_url)
    assert (url.hostname, url.port) == (services["prefill"]["hostname"], prefill.port)
    for name, service in services.items():
        assert service["image"] == f"tgserve:{VERSION}"
        assert float(service["stop_grace_period"].rstrip("s")) > settings[name].shutdown_timeout
        assert ("ports" in service) == (name == "decode")  # clients reach the decode server
