"""SamplingParams: how one request decodes, and when it stops.

Contract: frozen; construction checks the vocabulary-free rules and `validate_for_vocab(vocab_size)`
the token ids it names; both raise `InvalidRequest` (engine/errors.py) carrying the field
it is about, so the server can turn it into a 400 naming its API field before any work starts. The HTTP schemas are the one place API fields map onto this class.
Greedy decoding (temperature 0) with n > 1 or best_of > 1 is refused, as vLLM does: every
sequence would be the same. Beam search is the deterministic way to get several outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.errors import InvalidRequest
from engine.requests.structured_output import StructuredOutput

if TYPE_CHECKING:
    from engine.requests.fault_spec import FaultSpec

MAX_N = 16  # upper bound of n and best_of: each extra sequence costs KV blocks and a batch row
MAX_LOGPROBS = 20  # OpenAI's own limit of top logprobs
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_LEN = 256
MAX_LOGIT_BIAS = 300  # OpenAI's documented limit of logit_bias entries
# Below this temperature a request decodes greedily (vLLM's rule): dividing logits by a smaller
# one overflows float32 (1e-38 made every logit inf), and the distribution is the argmax anyway.
GREEDY_BELOW_TEMPERATURE = 1e-5
# The repetition penalty divides / multiplies logits: outside [1/100, 100] a logit of ~30 would
# leave float32's comfortable range (1e-40 overflowed it), and no use needs more.
REPETITION_PENALTY_RANGE = (0.01, 100.0)
# Beam scores are divided by length ** length_penalty: past +-10 that overflows a float for
# long outputs (1000 and -1e308 raised), and a hypothesis ranking needs nowhere near it.
LENGTH_PENALTY_RANGE = (-10.0, 10.0)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int | None = 16  # None: the room left in the context (the engine fills it in)
    min_tokens: int = 0
    temperature: float = 1.0  # in [0, 100]; below GREEDY_BELOW_TEMPERATURE (1e-5): greedy
    top_k: int = 0  # 0 or -1: off; any larger value is clamped to the vocabulary (never overflows)
    top_p: float = 1.0  # in (0, 1]; so small that no token fits: the top token alone is kept
    min_p: float = 0.0
    # transformers' definition (divides positive logits), in REPETITION_PENALTY_RANGE
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0  # OpenAI's definition (subtracted once per seen token), [-2, 2]
    frequency_penalty: float = 0.0  # OpenAI's definition (subtracted per occurrence), [-2, 2]
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # None: none; k: the chosen token and the top k
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    # n > 1 / best_of: independent samples sharing the prompt's KV blocks.
    n: int = 1
    best_of: int | None = None
    # Beam search: best_of (or n) beams; returns n hypotheses.
    use_beam_search: bool = False
    length_penalty: float = 1.0  # finite, in LENGTH_PENALTY_RANGE ([-10, 10])
    early_stopping: bool = False
    # Scheduling order (not sampling): lower runs first, as vLLM's; admission, prefill order
    # and preemption (the highest value is preempted first). Outputs never depend on it.
    priority: int = 0
    # Whether the caller reads the tokens as they come (an SSE stream): only steps that give a
    # streamed request a token are held to the step-time target (scheduler.py). A whole-output
    # request (stream false, an offline batch) has no inter-token latency to protect, so steps
    # that serve only such requests fill the token budget, and `Engine.step()` hands out its
    # first token's output and its last only. Its tokens and text never depend on it.
    streamed: bool = True
    # A grammar the output must follow (JSON schema, regex, choice, Lark); compiled and checked
    # by the engine at request validation (engine/requests/structured_output.py).
    structured_output: StructuredOutput | None = None
    # The LoRA adapter the request runs under, by its served name (None: the base model); the
    # engine refuses a name it does not know (engine/lora_adapters.py).
    adapter: str | None = None
    # Tests only (engine/requests/fault_spec.py): fail this request or kill the engine after k tokens.
    fault: FaultSpec | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop))
        if not isinstance(self.stop_token_ids, tuple):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        self._check()

    @property
    def greedy(self) -> bool:
        """Temperature 0, or so close to it that sampling would be the argmax anyway."""
        return self.temperature < GREEDY_BELOW_TEMPERATURE

    @property
    def num_sequences(self) -> int:
        """How many sequences the engine runs for this request (beams or samples)."""
        return self.best_of if self.best_of is not None else self.n

    def _check(self) -> None:
        def need(ok: bool, name: str, message: str) -> None:
            if not ok:
                raise InvalidRequest(name, f"{name} {message}")

        need(
            self.max_tokens is None or self.max_tokens >= 1,
            "max_tokens",
            f"must be at least 1, got {self.max_tokens}",
        )
        need(self.min_tokens >= 0, "min_tokens", f"must be >= 0, got {self.min_tokens}")
        need(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            "min_tokens",
            f"({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
        )
        need(
            0.0 <= self.temperature <= 100.0,
            "temperature",
            f"must be in [0, 100], got {self.temperature}",
        )
        need(self.top_k >= -1, "top_k", f"must be -1, 0 (off) or positive, got {self.top_k}")
        need(0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}")
        need(0.0 <= self.min_p <= 1.0, "min_p", f"must be in [0, 1], got {self.min_p}")
        low, high = REPETITION_PENALTY_RANGE
        need(
            low <= self.repetition_penalty <= high,
            "repetition_penalty",
            f"must be in [{low}, {high}], got {self.repetition_penalty}",
        )
        low, high = LENGTH_PENALTY_RANGE
        need(  # NaN fails every comparison, so it is refused too
            low <= self.length_penalty <= high,
            "length_penalty",
            f"must be in [{low:g}, {high:g}], got {self.length_penalty}",
        )
        need(
            -2.0 <= self.presence_penalty <= 2.0,
            "presence_penalty",
            f"must be in [-2, 2], got {self.presence_penalty}",
        )
        need(
            -2.0 <= self.frequency_penalty <= 2.0,
            "frequency_penalty",
            f"must be in [-2, 2], got {self.frequency_penalty}",
        )
        need(
            len(self.logit_bias) <= MAX_LOGIT_BIAS,
            "logit_bias",
            f"may hold at most {MAX_LOGIT_BIAS} entries",
        )
        for token_id, bias in self.logit_bias.items():
            need(
                -100.0 <= bias <= 100.0,
                "logit_bias",
                f"values must be in [-100, 100], got {bias} for token {token_id}",
            )
        need(
            len(self.stop) <= MAX_STOP_STRINGS,
            "stop",
            f"may hold at most {MAX_STOP_STRINGS} strings",
        )
        for s in self.stop:
            need(
                0 < len(s) <= MAX_STOP_STRING_LEN,
                "stop",
                f"strings must be 1..{MAX_STOP_STRING_LEN} characters",
            )
        for name, k in (("logprobs", self.logprobs), ("prompt_logprobs", self.prompt_logprobs)):
            if k is not None:
                need(0 <= k <= MAX_LOGPROBS, name, f"must be in [0, {MAX_LOGPROBS}], got {k}")
        need(1 <= self.n <= MAX_N, "n", f"must be in [1, {MAX_N}], got {self.n}")
        if self.best_of is not None:
            need(
                self.n <= self.best_of <= MAX_N,
                "best_of",
                f"must be in [n={self.n}, {MAX_N}], got {self.best_of}",
            )
        if self.greedy and not self.use_beam_search:
            same = (
                f"with temperature 0 (or below {GREEDY_BELOW_TEMPERATURE:g}: greedy decoding) "
                "every sequence is the same; use a higher temperature or use_beam_search"
            )
            need(self.n == 1, "n", f"must be 1 {same}, got {self.n}")
            need(self.best_of in (None, 1), "best_of", f"must be 1 {same}, got {self.best_of}")
        if self.seed is not None:
            need(0 <= self.seed < 2**63, "seed", f"must be in [0, 2**63), got {self.seed}")
        need(
            isinstance(self.priority, int)
            and not isinstance(self.priority, bool)
            and -(2**31) <= self.priority < 2**31,
            "priority",
            f"must be an integer in [-2**31, 2**31), got {self.priority!r}",
        )

    def validate_for_vocab(self, vocab_size: int) -> None:
        """Checks the token ids this request names against the model's vocabulary."""
        for name, token_ids in (
            ("logit_bias", self.logit_bias),
            ("stop_token_ids", self.stop_token_ids),
        ):
            for token_id in token_ids:
                if not 0 <= token_id < vocab_size:
                    raise InvalidRequest(
                        name,
                        f"{name}: token id {token_id} is outside the vocabulary (size {vocab_size})",
                    )
