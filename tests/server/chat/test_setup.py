"""chat_setup: the tool-call parser a model's chat template selects, with its special tokens.

Oracle: hand-written templates and a fake tokenizer whose special tokens are known: a
template that writes `[TOOL_CALLS]name[ARGS]{...}` gives Mistral's named form, whose enforcing
grammar names the markers by their token ids; an older Mistral template gives the list form.
"""

from __future__ import annotations

from models.tokenizer.chat_template import ChatTemplate
from server.chat.setup import chat_setup
from server.chat.tool_calls import FunctionSpec
from server.chat.tool_calls.mistral import MistralParser
from server.settings import Settings

NAMED = (
    "{%- for m in messages %}{%- if m.tool_calls %}{%- for c in m.tool_calls %}"
    "{{- '[TOOL_CALLS]' + c.function.name + '[ARGS]' + c.function.arguments }}"
    "{%- endfor %}{%- else %}{{ m.content }}{%- endif %}{%- endfor %}{{ tools }}"
)
LISTED = "{{- '[TOOL_CALLS]' + (messages[-1].tool_calls | tojson) }}{{ tools }}"
SPECIAL = {"[TOOL_CALLS]": 9, "[ARGS]": 32}


class FakeTokenizer:
    def __init__(self, template: str) -> None:
        self.chat_template = ChatTemplate(template, {})

    def encode(self, text: str) -> list[int]:
        return [SPECIAL[text]] if text in SPECIAL else [ord(c) for c in text]

    def is_special(self, token_id: int) -> bool:
        return token_id in SPECIAL.values()


def test_a_template_writing_args_gives_the_named_form_with_its_token_ids():
    setup = chat_setup(FakeTokenizer(NAMED), Settings())
    parser = setup.parser
    assert isinstance(parser, MistralParser) and parser.named and setup.takes_tools
    grammar = parser.grammar([FunctionSpec("now")], parallel=False)
    assert "<[9]>" in grammar and "<[32]>" in grammar and "[CALL_ID]" not in grammar


def test_an_older_mistral_template_gives_the_list_form():
    parser = chat_setup(FakeTokenizer(LISTED), Settings()).parser
    assert isinstance(parser, MistralParser) and not parser.named
    assert parser.grammar([FunctionSpec("now")], parallel=False).startswith('start: <[9]> "["')
