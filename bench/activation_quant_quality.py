"""What `--activation-quantization int8` costs in logits, on a GGUF kept as stored.

`python -m bench.activation_quant_quality [--model PATH] [--dtype float32] [--prompts N]` loads
the model (default: SmolLM2-135M-Instruct Q4_1) twice in one process, once as served without the
option and once with every Q4_0 / Q4_1 / Q8_0 / int8 layer on int8 activations
(models/activation_quant.py), runs the same prompts (a prefill each, teacher-forced: every
position's logits) through the PyTorch forward of both, and prints one JSON line: the logits'
max and mean |difference|, the spread of the float logits (for scale), and how often the top-1
token agrees, over every position of every prompt.
"""

from __future__ import annotations

import argparse
import json

import torch

from models import allocate_kv_cache
from models.activation_quant import quantize_activations_int8
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.activation_quant_quality")
    parser.add_argument("--model", default=None, help="GGUF file (default: the default model)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    args = parser.parse_args(argv)
    path = args.model or default_model_path()
    tokenizer = load_tokenizer(path)
    prompts = [tokenizer.encode(p) for p in PROMPTS[: args.prompts]]
    model, _ = load_model(path, args.dtype, "cpu")
    want = [prompt_logits(model, ids) for ids in prompts]
    layers = quantize_activations_int8(model)
    got = [prompt_logits(model, ids) for ids in prompts]
    diff = torch.cat([(g - w).abs().flatten() for g, w in zip(got, want, strict=True)])
    agree = sum(int((g.argmax(-1) == w.argmax(-1)).sum()) for g, w in zip(got, want, strict=True))
    positions = sum(len(ids) for ids in prompts)
    flat = torch.cat([w.flatten() for w in want])
    print(
        json.dumps(
            {
                "model": str(path),
                "dtype": args.dtype,
                "int8_layers": layers,
                "prompts": len(prompts),
                "positions": positions,
                "max_abs_logit_error": round(float(diff.max()), 4),
                "mean_abs_logit_error": round(float(diff.mean()), 5),
                "float_logit_std": round(float(flat.std()), 3),
                "float_logit_range": [round(float(flat.min()), 2), round(float(flat.max()), 2)],
                "top1_agreement": round(agree / positions, 4),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
