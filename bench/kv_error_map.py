"""Where int8 K/V's error comes from: which layers, K or V, which positions (PERFORMANCE.md).

`python -m bench.kv_error_map [--model PATH] [--greedy] NAME=SPEC ...` builds one engine with a
float32 K/V cache on the PyTorch layers and the C++ attention (the C++ step appends its own K/V,
so it is set aside), scores the 10 passages of bench/kv_cache_quality once as they are, then
once per NAME with the K/V rows SPEC picks rounded through int8 rows on their way into the
cache (models/kv_quant.py's quantize_rows then dequantize_rows: the values the int8 cache's
attention reads), and prints one JSON line each: the mean and max change of a token's
log-probability against the float cache, and the bits-per-byte change. `--greedy` adds the 8 +
16 prompts' greedy counts (48 tokens each, bench/kv_cache_quality's sets). A simulation: the
figures of record are bench.kv_cache_quality's, on the engine's own int8 cache.

SPEC: comma-separated `k:LAYERS`, `v:LAYERS` (default `all` each), `sink:N` (positions
0..N-1 of every sequence kept exact), `kbits:B` / `vbits:B` (keys / values rounded as the int8
rows are but to B-bit integers, [-(2^(B-1) - 1), 2^(B-1) - 1]: what more bits would buy; default
8 = the int8 rows themselves) and `kfloat:bfloat16` / `vfloat:float16` (rounded to that dtype
instead, as a cache of it would hold them), `kmu:SOURCE` (each layer's keys rounded as k - mu
then mu added back, mu [kv_heads, D] the mean of that layer's post-RoPE keys over SOURCE:
`passages` (the scored passages themselves: an in-sample bound), `random` (512 seeded uniform
token ids) or `text` (CALIBRATION, a paragraph of none of our sets); softmax is invariant to the
q . mu every key of a query shares, so a cache could store the offset rows exactly so) and
`ks:ALPHA` (with `kmu`: k - mu divided per channel by s = d^ALPHA before the rounding and
multiplied back after, d [kv_heads, D] the channel's RMS about mu over the same SOURCE,
normalised to a geometric mean of 1: exact too, were the query multiplied by s). LAYERS: `all`, `none`, `3`, `0-4`, `0+29`, or `~` then
one of those (every layer but those). `k:0-4,v:none` rounds the keys of layers 0-4 only.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from contextlib import contextmanager

import torch

from bench.activation_quant_quality import PROMPTS
from bench.kv_cache_quality import more_prompts, passages, scored
from engine import Engine, EngineConfig, SamplingParams
from models import attention_backend, forward_path
from models.kv_quant import dequantize_rows, quantize_rows, rotation_block, walsh_hadamard

Rounding = Callable[[torch.Tensor, torch.Tensor, int, torch.Tensor], tuple]


def layer_set(text: str, num_layers: int) -> set[int]:
    """`all`, `none`, `3`, `0-4`, `0+29`, or `~` before one of those (its complement)."""
    if text.startswith("~"):
        return set(range(num_layers)) - layer_set(text[1:], num_layers)
    if text in ("all", "none"):
        return set(range(num_layers)) if text == "all" else set()
    if "-" in text:
        lo, hi = (int(x) for x in text.split("-"))
        return set(range(lo, hi + 1))
    return {int(x) for x in text.split("+")}


def rounded(x: torch.Tensor, bits: int, dtype: str | None) -> torch.Tensor:
    """x [..., D] as a cache of those rows would give it back (see the module doc)."""
    if dtype is not None:
        return x.to(getattr(torch, dtype)).to(x.dtype)
    if bits == 8:
        return dequantize_rows(quantize_rows(x)).to(x.dtype)
    qmax = 2.0 ** (bits - 1) - 1
    y = walsh_hadamard(x.double())
    scale = (y.abs().amax(dim=-1, keepdim=True) / qmax).clamp_min(1e-30)
    return (walsh_hadamard(torch.round(y / scale) * scale) / rotation_block(x.shape[-1])).to(
        x.dtype
    )


def rounding(spec: str, num_layers: int, offsets: dict[str, list[tuple]] | None = None) -> Rounding:
    """(k, v [tokens, kv_heads, D], layer, positions [tokens]) -> the (k, v) the cache gets;
    `offsets`: by `kmu` source, per layer the keys' mean and RMS about it (`key_stats`)."""
    parts = dict(p.split(":") for p in spec.split(",") if p)
    keys = layer_set(parts.get("k", "all"), num_layers)
    values = layer_set(parts.get("v", "all"), num_layers)
    sink = int(parts.get("sink", 0))
    kbits, vbits = int(parts.get("kbits", 8)), int(parts.get("vbits", 8))
    kfloat, vfloat = parts.get("kfloat"), parts.get("vfloat")
    stats = offsets[parts["kmu"]] if offsets and "kmu" in parts else None
    alpha = float(parts.get("ks", 0))
    # Per layer (mu, s), each [kv_heads, D]; s's geometric mean is 1 per head. None: plain rows.
    shifts = None if stats is None else [(mu, _channel_scale(dev, alpha)) for mu, dev in stats]

    def apply(k: torch.Tensor, v: torch.Tensor, layer: int, positions: torch.Tensor) -> tuple:
        exact = (positions < sink)[:, None, None]  # [tokens, 1, 1]
        if layer in keys:
            if shifts is None:
                k = torch.where(exact, k, rounded(k, kbits, kfloat))
            else:
                mu, s = shifts[layer]
                k = torch.where(exact, k, rounded((k - mu) / s, kbits, kfloat) * s + mu)
        if layer in values:
            v = torch.where(exact, v, rounded(v, vbits, vfloat))
        return k, v

    return apply


def _channel_scale(dev: torch.Tensor, alpha: float) -> torch.Tensor:
    """s = dev^alpha [kv_heads, D], normalised to a geometric mean of 1 per head."""
    s = dev.clamp_min(1e-6).pow(alpha)
    return s / s.log().mean(dim=-1, keepdim=True).exp()


@contextmanager
def rounded_writes(layer_of: dict[int, int], current: list):
    """The PyTorch layers' K/V appends through `current[0]` (None: as they are), each layer's
    keys' float64 sum, sum of squares and count added to `current[1]` when it is a dict;
    `layer_of` maps a K cache's address to its layer, numbered in the order a forward first
    writes them (the layers run in order; the engine's runner stays behind its front door)."""
    backend = attention_backend.CppAttentionBackend
    original_write, original_paths = backend.write_kv, forward_path.BACKENDS_BY_DEVICE["cpu"]

    def write_kv(self, cache, k, v, meta) -> None:
        layer = layer_of.setdefault(cache[0].data_ptr(), len(layer_of))
        if current[1] is not None:
            total, squares, count = current[1].get(layer, (0.0, 0.0, 0))
            k64 = k.double()
            current[1][layer] = (total + k64.sum(0), squares + k64.square().sum(0), count + len(k))
        if current[0] is not None:
            spans = zip(meta.seq_lens_list, meta.query_lens, strict=True)
            positions = torch.cat([torch.arange(end - n, end) for end, n in spans])
            k, v = current[0](k, v, layer, positions)
        original_write(self, cache, k, v, meta)

    backend.write_kv = write_kv
    forward_path.BACKENDS_BY_DEVICE["cpu"] = ("pytorch_cpu",)
    try:
        yield
    finally:
        backend.write_kv = original_write
        forward_path.BACKENDS_BY_DEVICE["cpu"] = original_paths


# A calibration paragraph of none of our sets (not the passages, not the greedy prompts).
CALIBRATION = (
    "The river runs north through the valley for about forty miles before it turns east and "
    "meets the sea. Farmers on both banks grow wheat, barley and apples, and in the autumn "
    "the roads fill with carts on their way to the market in town. The old stone bridge was "
    "built in 1820 and rebuilt after the flood of 1911; a newer one of steel crosses a mile "
    "downstream. Children learn to swim in the shallow bend below the mill, where the water "
    "is warm in July. In the evening people walk along the path by the water, talk about the "
    "weather and the harvest, and watch the boats come home. Q: How long is the river's "
    "course through the valley? A: About forty miles. Q: When was the bridge rebuilt? A: "
    "After the flood of 1911. def mean(xs):\n    return sum(xs) / len(xs)\n\nprint(mean([1, "
    "2, 3]))\n# 2.0\n"
)


def key_stats(engine: Engine, source: str, current: list) -> list[tuple]:
    """Per layer, the float32 mean [kv_heads, D] of the keys its prompts write and their RMS
    about it (float64 sums)."""
    if source == "random":
        gen = torch.Generator().manual_seed(0)
        prompts: list = [torch.randint(0, engine.info.vocab_size, (512,), generator=gen).tolist()]
    else:
        prompts = passages() if source == "passages" else [CALIBRATION]
    current[:] = [None, {}]
    engine.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0))
    sums, current[1] = current[1], None
    out = []
    for layer in sorted(sums):
        total, squares, count = sums[layer]
        mean = total / count
        out.append((mean.float(), (squares / count - mean.square()).clamp_min(0).sqrt().float()))
    return out


def measure(engine: Engine, greedy: bool) -> tuple[list, list]:
    tokens = []
    if greedy:
        params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
        prompts = list(PROMPTS) + more_prompts(16)
        tokens = [out.outputs[0].token_ids for out in engine.generate(prompts, params)]
    return tokens, scored(engine, passages())


def compare(base: tuple[list, list], test: tuple[list, list]) -> dict:
    (want, ref), (got, new) = base, test
    pairs = [(a, b) for pa, pb in zip(ref, new, strict=True) for a, b in zip(pa, pb, strict=True)]
    nbytes = sum(len(t.encode()) for t in passages())

    def bpb(s: list) -> float:
        return -sum(t.logprob for p in s for t in p) / math.log(2) / nbytes

    out = {
        "mean_abs_logprob_change": round(
            sum(abs(a.logprob - b.logprob) for a, b in pairs) / len(pairs), 5
        ),
        "max_abs_logprob_change": round(max(abs(a.logprob - b.logprob) for a, b in pairs), 4),
        "bits_per_byte_change": f"{100 * (bpb(new) / bpb(ref) - 1):+.3f}%",
    }
    if want:
        same = [w == g for w, g in zip(want, got, strict=True)]
        n = len(PROMPTS)
        out["greedy_unchanged"] = f"{sum(same[:n])} / {n}"
        out["more_prompts_unchanged"] = f"{sum(same[n:])} / {len(same) - n}"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kv_error_map")
    parser.add_argument("--model", default=None, help="model path (default: the default model)")
    parser.add_argument("--greedy", action="store_true", help="also the 8 + 16 greedy counts")
    parser.add_argument("variants", nargs="+", metavar="NAME=SPEC")
    args = parser.parse_args(argv)
    current: list = [None, None]  # the rounding, the key sums being recorded
    layer_of: dict[int, int] = {}
    with rounded_writes(layer_of, current):
        config = EngineConfig(
            dtype="float32", enable_prefix_caching=False, activation_quantization=None
        )
        engine = Engine.from_model(args.model, config)
        base = measure(engine, args.greedy)  # its first forward numbers the layers' caches
        offsets: dict[str, list[tuple]] = {}
        for variant in args.variants:
            name, spec = variant.split("=", 1)
            source = dict(p.split(":") for p in spec.split(",") if p).get("kmu")
            if source is not None and source not in offsets:
                offsets[source] = key_stats(engine, source, current)
                norms = [round(float(m.norm(dim=-1).mean()), 3) for m, _ in offsets[source]]
                print(json.dumps({"kmu": source, "mean_norm_by_layer": norms}), flush=True)
            current[0] = rounding(spec, len(layer_of), offsets)
            result = {"variant": name, "spec": spec, **compare(base, measure(engine, args.greedy))}
            print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
