"""Property-based API fuzzing: schemathesis drives every operation of GET /openapi.json.

Against a live server on the fake engine, each operation gets generated requests (valid bodies
from the declared request schemas and invalid ones: wrong types, missing fields) and every
answer must: never be a 5xx, have a content type the document declares, and match the declared
response schema (the 200 body, or the route family's error body). Bounded: a fixed number of
derandomized examples per operation (25; 10 under the CI profile, tests/property_budget.py: the
same strategies and checks, fewer draws); for a longer local run, TGSERVE_FUZZ_EXAMPLES=500
raises the count and TGSERVE_FUZZ_RANDOM=1 draws fresh examples each run.
"""

from __future__ import annotations

import os

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from tests.property_budget import examples
from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer

EXAMPLES = int(os.environ.get("TGSERVE_FUZZ_EXAMPLES", str(examples(25, 10))))
RANDOM = os.environ.get("TGSERVE_FUZZ_RANDOM") == "1"
CHECKS = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_schema_conformance,
]


@pytest.fixture(scope="module")
def live():
    def engine() -> FakeEngine:
        return FakeEngine(max_model_len=64, max_num_seqs=16, step_delay=0.0)

    with LiveServer(engine, admission_limit=64) as server:
        yield server


@pytest.fixture(scope="module")
def api(live):
    return schemathesis.openapi.from_url(live.url + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api")


def test_the_document_declares_every_route_with_its_body(live) -> None:
    doc = httpx.get(live.url + "/openapi.json").json()
    assert set(doc["paths"]) == {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/v1/models/{model_id}",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/responses",
        "/v1/responses/{response_id}",
        "/generate",
        "/generate_stream",
        "/",
        "/info",
        "/health",
        "/ready",
        "/metrics",
        "/version",
        "/tokenize",
        "/detokenize",
    }
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            assert "default" in operation["responses"], (method, path)
            if method == "post":
                assert operation["requestBody"]["required"], path
    completion = doc["components"]["schemas"]["CompletionRequest"]
    assert "prompt" in completion["required"]


def test_the_document_needs_the_key_unless_public() -> None:
    with LiveServer(FakeEngine, api_key=("k",)) as server:
        assert httpx.get(server.url + "/openapi.json").status_code == 401
        doc = httpx.get(server.url + "/openapi.json", headers={"Authorization": "Bearer k"}).json()
        assert doc["paths"]["/v1/models"]["get"]["security"] == [{"bearer": []}]
        assert doc["paths"]["/health"]["get"]["security"] == []
    public = ("/health", "/ready", "/metrics", "/openapi.json")
    with LiveServer(FakeEngine, api_key=("k",), public_routes=public) as server:
        assert httpx.get(server.url + "/openapi.json").status_code == 200


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not RANDOM,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_server_errors_and_responses_conform(case) -> None:
    case.call_and_validate(checks=CHECKS, timeout=30)
