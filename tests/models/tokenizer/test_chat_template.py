"""Chat templates render exactly as transformers' apply_chat_template renders them: SmolLM2's
template from its GGUF, and templates from tokenizer_config.json / chat_template.jinja; template
errors and sandbox violations surface as ValueError."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest
from tokenizers import Tokenizer as HfBackend
from tokenizers import decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from models.tokenizer import load_tokenizer
from tests.devices import default_model_here

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "Answer in one word. Réponds en français."},
        {"role": "user", "content": "  Capital of France?  "},
    ],
    [
        {"role": "user", "content": "Hi 👋"},
        {"role": "assistant", "content": "Hello! 你好"},
        {"role": "user", "content": "Tell me a joke\nwith two lines"},
    ],
]

# Llama-3-like, exercising what transformers' environment does: whitespace control (trim_blocks,
# lstrip_blocks, "-"), namespace, tojson, loop controls, raise_exception, {% generation %},
# bos/eos variables and extra keyword arguments.
RICH_TEMPLATE = """{{- bos_token }}
{%- set ns = namespace(system=none) %}
{%- if messages[0]['role'] == 'system' %}
    {%- set ns.system = messages[0]['content'] %}
    {%- set messages = messages[1:] %}
{%- endif %}
{%- if ns.system is not none or tools is not none %}
<|start_header_id|>system<|end_header_id|>

    {% if ns.system is not none %}{{ ns.system }}{% endif %}
    {% if tools is not none %}Tools: {{ tools | tojson(indent=2) }}{% endif %}
<|eot_id|>
{%- endif %}
{%- for message in messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/...') }}
    {%- endif %}
    <|start_header_id|>{{ message['role'] }}<|end_header_id|>

    {% if message['role'] == 'assistant' %}
        {% generation %}{{ message['content'] | trim }}{% endgeneration %}
    {% else %}
        {{ message['content'] | trim }}
    {% endif %}
<|eot_id|>
{% endfor %}
{%- for i in range(10) %}{% if i == 3 %}{% break %}{% endif %}{% if i == 1 %}{% continue %}{% endif %}[{{ i }}]{% endfor %}
{%- if add_generation_prompt %}
<|start_header_id|>assistant<|end_header_id|>

{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}
{%- else %}{{ eos_token }}
{%- endif %}"""

SPECIALS = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
TOOLS = [{"name": "weather", "description": "Météo <now> & later", "parameters": {"city": "str"}}]


@pytest.fixture(scope="module")
def smollm_pair():
    path = default_model_here()
    folder, name = path.parent, path.name
    return load_tokenizer(folder / name), AutoTokenizer.from_pretrained(str(folder), gguf_file=name)


def _folder(root: Path, config: dict, jinja_file: str | None = None) -> Path:
    """A tiny byte-level BPE folder whose tokenizer_config.json is `config`."""
    backend = HfBackend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator([c["content"] for conv in CONVERSATIONS for c in conv], trainer)
    root.mkdir(parents=True)
    backend.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    if jinja_file is not None:
        (root / "chat_template.jinja").write_text(jinja_file)
    return root


@pytest.fixture(scope="module")
def rich_pair(tmp_path_factory):
    config = {"bos_token": SPECIALS[0], "eos_token": SPECIALS[1], "chat_template": RICH_TEMPLATE}
    folder = _folder(tmp_path_factory.mktemp("rich") / "tok", config)
    return load_tokenizer(folder), PreTrainedTokenizerFast.from_pretrained(str(folder))


def _hf_render(hf, messages, **kwargs) -> str:
    return hf.apply_chat_template(messages, tokenize=False, **kwargs)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_smollm2_gguf_template_renders_as_transformers(smollm_pair, add_generation_prompt):
    ours, hf = smollm_pair
    for messages in CONVERSATIONS:
        expected = _hf_render(hf, messages, add_generation_prompt=add_generation_prompt)
        assert ours.apply_chat_template(messages, add_generation_prompt) == expected


def test_tokenizer_config_template_renders_as_transformers(rich_pair):
    ours, hf = rich_pair
    variants = [
        {"add_generation_prompt": True},
        {"add_generation_prompt": False},
        {"add_generation_prompt": True, "tools": TOOLS},
        {"add_generation_prompt": True, "enable_thinking": False},
    ]
    for messages in CONVERSATIONS:
        for kwargs in variants:
            rendered = ours.apply_chat_template(messages, **kwargs)
            assert rendered == _hf_render(hf, messages, **kwargs)
    assert rendered.startswith(SPECIALS[0])  # bos_token reached the template


def test_chat_template_jinja_file_takes_precedence_as_in_transformers(tmp_path):
    config = {"bos_token": SPECIALS[0], "eos_token": SPECIALS[1], "chat_template": "config {{ 1 }}"}
    jinja_file = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{{ eos_token }}"
    )
    folder = _folder(tmp_path / "tok", config, jinja_file)
    ours, hf = load_tokenizer(folder), PreTrainedTokenizerFast.from_pretrained(str(folder))
    for messages in CONVERSATIONS:
        assert ours.apply_chat_template(messages) == _hf_render(
            hf, messages, add_generation_prompt=True
        )
        assert "config" not in ours.apply_chat_template(messages)


def test_named_templates_use_the_default_as_in_transformers(tmp_path):
    named = [
        {"name": "default", "template": "D{{ messages | length }}"},
        {"name": "rag", "template": "R"},
    ]
    folder = _folder(tmp_path / "tok", {"chat_template": named})
    ours, hf = load_tokenizer(folder), PreTrainedTokenizerFast.from_pretrained(str(folder))
    messages = CONVERSATIONS[2]
    assert ours.apply_chat_template(messages) == _hf_render(hf, messages) == "D3"


def test_raise_exception_in_template_becomes_value_error(rich_pair):
    ours, hf = rich_pair
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(jinja2.TemplateError, match="roles must alternate") as hf_error:
        _hf_render(hf, bad)
    with pytest.raises(ValueError, match="roles must alternate") as our_error:
        ours.apply_chat_template(bad)
    assert str(hf_error.value) in str(our_error.value)


def test_template_runs_sandboxed(tmp_path):
    """Templates come from model files: no reaching Python internals, no mutating the inputs."""
    escapes = {
        "attr": "{{ messages.__class__.__mro__ }}",
        "subclasses": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "mutate": "{{ messages.append({'role': 'x'}) }}",
    }
    messages = [dict(m) for m in CONVERSATIONS[0]]
    for name, template in escapes.items():
        ours = load_tokenizer(_folder(tmp_path / name, {"chat_template": template}))
        with pytest.raises(ValueError, match="chat template error: .* is unsafe"):
            ours.apply_chat_template(messages)
    assert messages == CONVERSATIONS[0]
    hidden = load_tokenizer(
        _folder(tmp_path / "g", {"chat_template": "{{ raise_exception.__globals__ }}"})
    )
    assert hidden.apply_chat_template(messages) == ""  # an unsafe attribute is undefined


def test_missing_template_raises_value_error(tmp_path):
    ours = load_tokenizer(_folder(tmp_path / "tok", {}))
    with pytest.raises(ValueError, match="no chat template"):
        ours.apply_chat_template(CONVERSATIONS[0])
    bad_syntax = load_tokenizer(_folder(tmp_path / "bad", {"chat_template": "{% for %}"}))
    with pytest.raises(ValueError, match="does not compile"):
        bad_syntax.apply_chat_template(CONVERSATIONS[0])
