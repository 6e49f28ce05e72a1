"""What `--activation-quantization int8 | int16` costs in logits and answers, on a GGUF kept as
stored.

`python -m bench.activation_quant_quality [--model PATH] [--dtype float32] [--prompts N]
[--bits 8|16] [--greedy-tokens 32]` loads the model (default: SmolLM2-135M-Instruct Q4_1) twice
in one process, once as served without the option and once with every Q4_0 / Q4_1 / Q8_0 / int8
layer on `bits`-bit activations (models/activation_quant.py), runs the same prompts (a prefill
each, teacher-forced: every position's logits) through the PyTorch forward of both, and prints
one JSON line: the logits' max and mean |difference|, the spread of the float logits (for
scale), how often the top-1 token agrees, the mean |difference| of the log-probabilities of
each prompt's own next tokens and both models' bits per byte of the prompts. Then (unless
`--greedy-tokens 0`) two engines, float and the option, each generate greedily from every
prompt and answer the chat question (ChatML, the default system prompt): how many of the
continuations are the float ones, token for token, and both answers.
"""

from __future__ import annotations

import argparse
import json

import torch

from engine import Engine, EngineConfig, SamplingParams
from models import allocate_kv_cache
from models.activation_quant import quantize_activations
from models.attention import AttentionMetadata
from models.default_model import default_model_path
from models.loader import load_model
from models.tokenizer.loading import load_tokenizer

PROMPTS = (
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) +",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "Water boils at 100 degrees Celsius at sea level, but on a high mountain it boils at",
    "The mitochondria is the powerhouse of the cell. It produces energy in the form of",
    "To make a cup of tea, first boil some water, then put a tea bag in a cup and",
    "Photosynthesis converts light energy into chemical energy. Plants use carbon dioxide and",
    "In 1969, Neil Armstrong became the first person to walk on the moon. He said",
)
QUESTION = "What is the capital of France?"


def prompt_logits(model, ids: list[int], block_size: int = 16) -> torch.Tensor:
    """float32 [T, vocab]: the logits of every position of one prefill."""
    param = next(model.parameters())
    blocks = -(-len(ids) // block_size)
    kv = allocate_kv_cache(model.config, blocks, block_size, param.dtype, param.device)
    meta = AttentionMetadata.build(
        [list(range(blocks))], [len(ids)], [len(ids)], block_size, param.device,
        sliding_window=model.config.sliding_window,
    )  # fmt: skip
    with torch.inference_mode():
        hidden = model(torch.tensor(ids), torch.arange(len(ids)), meta, kv)
        return model.compute_logits(hidden).float()


def next_token_logprobs(logits: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """float64 [T - 1]: log p(ids[t + 1]) under position t's logits."""
    logp = torch.log_softmax(logits[:-1].double(), dim=-1)
    return logp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def greedy_answers(path, dtype: str, mode: str | None, prompts: list[str], tokens: int):
    """(continuations' token ids, the chat answer's text) of an engine with `mode` activations."""
    config = EngineConfig(dtype=dtype, activation_quantization=mode, device="cpu")
    engine = Engine.from_model(str(path), config)
    tok = engine.tokenizer
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    outs = engine.generate([tok.encode(p) for p in prompts], params)
    chat = tok.encode(tok.apply_chat_template([{"role": "user", "content": QUESTION}]))
    answer = engine.generate([chat], SamplingParams(max_tokens=32, temperature=0.0))[0]
    return [list(o.outputs[0].token_ids) for o in outs], answer.outputs[0].text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.activation_quant_quality")
    parser.add_argument("--model", default=None, help="GGUF file (default: the default model)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--bits", type=int, default=8, choices=[8, 16])
    parser.add_argument("--greedy-tokens", type=int, default=32, help="0: no engine run")
    args = parser.parse_args(argv)
    path = args.model or default_model_path()
    tokenizer = load_tokenizer(path)
    prompts = [tokenizer.encode(p) for p in PROMPTS[: args.prompts]]
    model, _ = load_model(path, args.dtype, "cpu")
    want = [prompt_logits(model, ids) for ids in prompts]
    layers = quantize_activations(model, args.bits)
    got = [prompt_logits(model, ids) for ids in prompts]
    lp_want = torch.cat([next_token_logprobs(w, ids) for w, ids in zip(want, prompts, strict=True)])
    lp_got = torch.cat([next_token_logprobs(g, ids) for g, ids in zip(got, prompts, strict=True)])
    text_bytes = sum(len(tokenizer.decode(ids[1:]).encode()) for ids in prompts)
    bpb = [
        round(float(-lp.sum() / torch.log(torch.tensor(2.0)) / text_bytes), 5)
        for lp in (lp_want, lp_got)
    ]
    diff = torch.cat([(g - w).abs().flatten() for g, w in zip(got, want, strict=True)])
    agree = sum(int((g.argmax(-1) == w.argmax(-1)).sum()) for g, w in zip(got, want, strict=True))
    positions = sum(len(ids) for ids in prompts)
    flat = torch.cat([w.flatten() for w in want])
    print(
        json.dumps(
            {
                "model": str(path),
                "dtype": args.dtype,
                "activation_bits": args.bits,
                "quantised_layers": layers,
                "prompts": len(prompts),
                "positions": positions,
                "max_abs_logit_error": round(float(diff.max()), 4),
                "mean_abs_logit_error": round(float(diff.mean()), 5),
                "float_logit_std": round(float(flat.std()), 3),
                "float_logit_range": [round(float(flat.min()), 2), round(float(flat.max()), 2)],
                "top1_agreement": round(agree / positions, 4),
                "mean_abs_next_token_logprob_error": float(
                    f"{(lp_got - lp_want).abs().mean():.3e}"
                ),
                "bits_per_byte_float_quantised": bpb,
            }
        )
    )
    if args.greedy_tokens:
        texts = list(PROMPTS[: args.prompts])
        mode = f"int{args.bits}"
        base, base_answer = greedy_answers(path, args.dtype, None, texts, args.greedy_tokens)
        ours, answer = greedy_answers(path, args.dtype, mode, texts, args.greedy_tokens)
        same = sum(a == b for a, b in zip(base, ours, strict=True))
        first = [
            next((t for t, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
            for a, b in zip(base, ours, strict=True)
        ]
        print(
            json.dumps(
                {
                    "greedy_tokens": args.greedy_tokens,
                    "continuations_equal_to_float": f"{same}/{len(texts)}",
                    "first_differing_token": first,
                    "chat_answer_float": base_answer,
                    f"chat_answer_{mode}": answer,
                }
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
