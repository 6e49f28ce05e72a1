"""The input-grounded workload: prompts asking the model to rewrite a passage they contain,
with one small edit, so most of a good answer copies the prompt (what speculative decoding's
prompt lookup is for: editing text or code, extraction, answers quoting a document).

Contract: `edit_prompt(rng, passage_tokens, tokenizer)` returns one prompt's text and
`edit_requests(num, input_len, output_len, seed, tokenizer)` the `BenchRequest`s of a run.
Both are pure functions of their arguments: passages are built from the word lists below by
`random.Random(seed)` (no file, no download), so every machine gets the same prompts. A passage
grows sentence by sentence until the whole prompt (instruction, passage and, where the model
has one, its chat template) holds about `input_len` tokens; prompts are cut to `input_len`
only when a single sentence overshoots by more than that.
"""

from __future__ import annotations

import random
from typing import Any, Protocol

from bench.workload import BenchRequest

ADJECTIVES = (
    "quiet", "narrow", "ancient", "bright", "careful", "distant", "heavy", "gentle",
    "patient", "rusty", "crowded", "hollow", "steady", "frozen", "golden", "restless",
)  # fmt: skip
NOUNS = (
    "river", "engineer", "lantern", "village", "bridge", "teacher", "garden", "harbor",
    "machine", "library", "farmer", "mountain", "letter", "workshop", "captain", "orchard",
)  # fmt: skip
VERBS = (
    "repaired", "crossed", "watched", "carried", "painted", "measured", "followed",
    "described", "visited", "opened", "guarded", "counted", "cleaned", "built",
)  # fmt: skip
PLACES = (
    "before sunrise", "after the storm", "during the market day", "near the old mill",
    "in the late afternoon", "beside the station", "under the grey sky", "at the end of winter",
)  # fmt: skip
TASKS = (
    "Rewrite the passage below, replacing every '{old}' with '{new}'. "
    "Keep every other word exactly as it is.",
    "Copy the passage below, changing the word '{old}' to '{new}' wherever it appears. "
    "Change nothing else.",
    "Edit the passage below: use '{new}' instead of '{old}', and leave the rest unchanged.",
)


class _Encoder(Protocol):
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


def _sentence(rng: random.Random) -> str:
    adj, noun, verb = rng.choice(ADJECTIVES), rng.choice(NOUNS), rng.choice(VERBS)
    adj2, noun2, place = rng.choice(ADJECTIVES), rng.choice(NOUNS), rng.choice(PLACES)
    return f"The {adj} {noun} {verb} the {adj2} {noun2} {place}."


def _chat(tokenizer: Any, text: str) -> str:
    """The model's chat rendering of a user message, or the text as it is."""
    if getattr(tokenizer, "chat_template", None) is None:
        return text
    return tokenizer.apply_chat_template([{"role": "user", "content": text}])


def edit_prompt(rng: random.Random, input_len: int, tokenizer: _Encoder) -> str:
    """One prompt of about `input_len` tokens (see the module contract)."""
    sentences = [_sentence(rng)]
    words = " ".join(sentences).rstrip(".").split()
    old = rng.choice([w for w in words if w in ADJECTIVES or w in NOUNS])
    kind = ADJECTIVES if old in ADJECTIVES else NOUNS  # an adjective for an adjective
    new = rng.choice([w for w in kind if w != old])
    task = rng.choice(TASKS).format(old=old, new=new)

    def render(passage: list[str]) -> str:
        return _chat(tokenizer, f"{task}\n\nPassage:\n{' '.join(passage)}")

    while True:
        candidate = sentences + [_sentence(rng)]
        if len(tokenizer.encode(render(candidate))) > input_len:
            return render(sentences)
        sentences = candidate


def edit_requests(
    num_requests: int, input_len: int, output_len: int, seed: int, tokenizer: _Encoder | None
) -> list[BenchRequest]:
    """`num_requests` edit prompts of about `input_len` tokens, each decoding `output_len`."""
    if tokenizer is None:
        raise ValueError("the edit workload is text: it needs the model's tokenizer")
    rng = random.Random(seed)
    requests = []
    for _ in range(num_requests):
        text = edit_prompt(rng, input_len, tokenizer)
        ids = tokenizer.encode(text)[:input_len]
        requests.append(BenchRequest(tuple(ids), output_len, text))
    return requests
