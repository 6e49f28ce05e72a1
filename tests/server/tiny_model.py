"""A tiny random Llama checkpoint with a real byte-level BPE tokenizer, for live server tests.

`make_tiny_model(folder)` writes config.json + model.safetensors (tests/checkpoints.py, seeded)
and a tokenizer.json trained here with the `tokenizers` library (vocabulary 320 like the model,
ChatML specials: <|endoftext|>=0, <|im_start|>=1, <|im_end|>=2 = the model's eos) plus a
tokenizer_config.json carrying a ChatML chat template.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun.",
    "Serving language models means batching requests, caching keys and values, and streaming tokens.",
    "Hello world! How are you today? I am fine, thank you, and you?",
    "Numbers like 12345 and 67890 are split one digit at a time by some tokenizers.",
    "Un café, s'il vous plaît. Grüße aus München. Ünïcödé text is welcome here.",
] * 20


def make_tiny_model(folder: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from tests.checkpoints import VOCAB, save_checkpoint  # imports torch: only when needed

    save_checkpoint("llama", folder, seed=0)
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_CORPUS, trainer)
    backend.save(str(folder / "tokenizer.json"))
    config = {"bos_token": None, "eos_token": "<|im_end|>", "chat_template": CHATML}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder
