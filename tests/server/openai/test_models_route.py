"""GET /v1/models/{id} through the official openai client: a served name is its model card (as
listed by /v1/models), any other id is a 404 in the OpenAI error shape naming `model`; names
holding "/" (Hugging Face ids) are served too.

Oracle: the served names the server was started with.
"""

from __future__ import annotations

import openai
import pytest

from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer

NAMES = ("org/tiny-model", "alias")


@pytest.fixture(scope="module")
def client():
    with LiveServer(FakeEngine, served_model_name=NAMES) as live:
        yield openai.OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0, timeout=20)


@pytest.mark.parametrize("name", NAMES)
def test_a_served_name_is_retrieved_as_its_listed_card(client, name):
    card = client.models.retrieve(name)
    listed = {m.id: m for m in client.models.list().data}
    assert card.id == name and card.object == "model"
    assert card.model_dump() == listed[name].model_dump()


@pytest.mark.parametrize("name", ["other", "org/other", "org"])
def test_an_unknown_id_is_a_404_naming_model(client, name):
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve(name)
    assert missing.value.body["param"] == "model" and name in missing.value.body["message"]
    assert missing.value.body["code"] == "model_not_found"
