"""T5 (v1.0, v1.1), BART and mBART loaded from tiny random Hugging Face folders compute what
transformers computes from the same folder: encoder outputs and decoder logits, float32 tight,
bfloat16 within tolerance, for a flat batch of sequences of different lengths whose decoder
rows arrive as a prefill chunk then single-token steps over scattered paged blocks (the
layout the engine gives them), cross K/V in blocks of their own."""

from __future__ import annotations

import random

import pytest
import torch

from models import allocate_kv_cache
from models.encdec.attention import SeqSpans
from models.encdec.t5 import relative_position_bucket
from models.loader import load_model
from tests.encdec_checkpoints import KINDS, VOCAB, load_hf, save_encdec_checkpoint

BLOCK = 4
ENCODER_LENS = (7, 13, 1)
DECODER_LENS = (6, 3, 9)  # the decoder start token included


@pytest.fixture(scope="module", params=KINDS)
def folder(request, tmp_path_factory):
    return save_encdec_checkpoint(request.param, tmp_path_factory.mktemp(request.param))


def _inputs(seed: int = 1) -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(seed)
    encoder = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in ENCODER_LENS]
    decoder = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in DECODER_LENS]
    return encoder, decoder


def _hf_reference(
    hf, encoder, decoder, device: torch.device | str = "cpu"
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per sequence alone (no padding), on `device`: encoder output [L, H], decoder logits
    [D, V], on the CPU in float64."""
    hf = hf.to(device)
    outs, logits = [], []
    with torch.no_grad():
        for enc, dec in zip(encoder, decoder, strict=True):
            ids = torch.tensor([enc], device=device)
            enc_out = hf.get_encoder()(input_ids=ids).last_hidden_state
            dec_ids = torch.tensor([dec], device=device)
            out = hf(encoder_outputs=(enc_out,), decoder_input_ids=dec_ids)
            outs.append(enc_out[0].double().cpu())
            logits.append(out.logits[0].double().cpu())
    return outs, logits


class PagedRun:
    """Our model over a paged cache laid out as the engine does: each sequence owns cross
    blocks and self blocks, scattered over the pool (shuffled ids)."""

    def __init__(self, model, config, dtype: torch.dtype, device: torch.device) -> None:
        self.model, self.config, self.device = model, config, device
        free = list(range(64))
        random.Random(0).shuffle(free)
        self.free = free
        self.caches = allocate_kv_cache(config, 64, BLOCK, dtype, device)

    def blocks(self, n_tokens: int) -> list[int]:
        return [self.free.pop() for _ in range(-(-n_tokens // BLOCK))]

    def encode(self, encoder: list[list[int]]) -> tuple[torch.Tensor, list[list[int]]]:
        ids = torch.tensor([t for seq in encoder for t in seq], device=self.device)
        positions = torch.tensor([p for seq in encoder for p in range(len(seq))], device=ids.device)
        lens = [len(seq) for seq in encoder]
        out = self.model.encode(ids, positions, lens)
        cross_tables = [self.blocks(n) for n in lens]
        slots = SeqSpans.build(cross_tables, lens, lens, BLOCK, self.device).slot_mapping
        self.model.write_cross_kv(out, slots, self.caches)
        return out, cross_tables


def _steps(decoder) -> list[list[tuple[int, int]]]:
    """A prefill chunk of the first half, then one row per step; (-1, -1): the sequence has
    no row in that step (it is done)."""
    first = [max(1, len(seq) // 2) for seq in decoder]
    steps = [[(0, f) for f in first]]
    longest = max(len(seq) for seq in decoder)
    for pos in range(min(first), longest):
        step = []
        for seq, f in zip(decoder, first, strict=True):
            step.append((pos, pos + 1) if f <= pos < len(seq) else (-1, -1))
        steps.append(step)
    return steps


def _run_ours(model, config, dtype, encoder, decoder):
    device = next(model.parameters()).device
    run = PagedRun(model, config, dtype, device)
    enc_out, cross_tables = run.encode(encoder)
    enc_lens = [len(s) for s in encoder]
    # Each step carries only the sequences with a row in it.
    tables = [run.blocks(len(seq)) for seq in decoder]
    rows: list[list[torch.Tensor]] = [[] for _ in decoder]
    for step in _steps(decoder):
        live = [i for i, (a, _) in enumerate(step) if a >= 0]
        ids = [t for i in live for t in decoder[i][step[i][0] : step[i][1]]]
        positions = [p for i in live for p in range(*step[i])]
        spans = SeqSpans.build(
            [tables[i] for i in live],
            [step[i][1] for i in live],
            [step[i][1] - step[i][0] for i in live],
            BLOCK,
            device,
        )
        cross = SeqSpans.build(
            [cross_tables[i] for i in live],
            [enc_lens[i] for i in live],
            spans.query_lens,
            BLOCK,
            device,
            writes=False,
        )
        as_tensor = torch.tensor  # on the model's device
        hidden = model(
            as_tensor(ids, device=device), as_tensor(positions, device=device), spans, run.caches,
            cross,
        )  # fmt: skip
        logits = model.compute_logits(hidden).cpu()
        start = 0
        for i, n in zip(live, spans.query_lens, strict=True):
            rows[i].append(logits[start : start + n])
            start += n
    enc_split = list(enc_out.float().cpu().split(enc_lens))
    return enc_split, [torch.cat(r) for r in rows]


def _stored_in_float32(model) -> list:
    """Hooks that round every leaf module's output to float32 (to undo: `.remove()` each)."""

    def rounded(module, args, out):
        return out.float().to(out.dtype) if isinstance(out, torch.Tensor) else None

    leaves = [m for m in model.modules() if not list(m.children())]
    return [m.register_forward_hook(rounded) for m in leaves]


@torch.inference_mode()
def test_encoder_and_decoder_match_transformers_in_float32(folder, device):
    """Against transformers in float64, our float32 run strays no further than a bound derived
    from the computation, not from another run's luck: transformers' float64 run with every
    layer's output rounded to float32 (the rounding any float32 run makes where it stores an
    intermediate, carried exactly through the rest of the model, so the wide random weights'
    amplification is in it: up to ~8e-4 on logits of scale 25), times K, the longest sum (the
    widest weight's inputs): each of a dot product's K additions rounds once, as storing its
    result does. (Measured: our run within 16x of that rounding, transformers' float32 within
    0.4x to 19x of it; the bound used to be twice transformers' own float32 error, which its
    luck on one host's BLAS set: 4.6x apart for mBART on an AVX2 host.) Where the exact
    logits' top two are further apart than twice the bound, ours picks the exact top token."""
    model, config = load_model(folder, "float32", device)
    encoder, decoder = _inputs()
    hf64 = load_hf(folder, torch.float64)
    exact = _hf_reference(hf64, encoder, decoder)
    hooks = _stored_in_float32(hf64)
    stored = _hf_reference(hf64, encoder, decoder)
    for hook in hooks:
        hook.remove()
    sums = max(p.shape[-1] for p in hf64.parameters() if p.dim() == 2)
    ours = _run_ours(model, config, torch.float32, encoder, decoder)
    checked = 0  # decoder rows whose top token is clear of the bound
    for got_part, stored_part, exact_part in zip(ours, stored, exact, strict=True):
        for got, rounded, want in zip(got_part, stored_part, exact_part, strict=True):
            floor = 2.0**-24 * want.abs().max()  # one rounding of the largest value
            bound = sums * ((rounded - want).abs().max() + floor)
            assert (got.double() - want).abs().max() <= bound
            if want.shape[-1] == config.vocab_size:  # decoder logits: the same tokens
                top2 = want.topk(2, dim=-1).values
                clear = top2[:, 0] - top2[:, 1] > 2 * bound
                assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])
                checked += int(clear.sum())
    assert checked >= sum(DECODER_LENS) // 2, checked  # the token check is not vacuous


@torch.inference_mode()
def test_bfloat16_logits_err_no_more_than_transformers_own_bfloat16(folder, device):
    """The oracle of bf16 rounding: transformers' bf16 run of the same folder against its fp32
    run. Ours (bf16) may stray from fp32 by at most twice what transformers' bf16 does."""
    model, config = load_model(folder, "bfloat16", device)
    encoder, decoder = _inputs(seed=2)
    _, want = _hf_reference(load_hf(folder), encoder, decoder)
    _, theirs = _hf_reference(load_hf(folder, torch.bfloat16), encoder, decoder)
    _, ours = _run_ours(model, config, torch.bfloat16, encoder, decoder)
    for got, ref, hf16 in zip(ours, want, theirs, strict=True):
        got = got.double()
        assert (got - ref).abs().mean() <= 2 * (hf16 - ref).abs().mean()
        assert (got - ref).abs().max() <= 2 * (hf16 - ref).abs().max()


def test_relative_position_buckets_match_transformers():
    from transformers.models.t5.modeling_t5 import T5Attention

    relative = torch.arange(-300, 300)[None, :]
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (8, 16), (6, 20)):
            want = T5Attention._relative_position_bucket(relative, bidirectional, buckets, distance)
            got = relative_position_bucket(relative, bidirectional, buckets, distance)
            assert torch.equal(got, want), (bidirectional, buckets, distance)


def test_config_reads_each_family(folder):
    import json

    from models.config import ModelConfig

    hf_config = json.loads((folder / "config.json").read_text())
    config = ModelConfig.from_hf_dict(hf_config)
    encdec = config.encoder_decoder
    assert encdec is not None and config.family in ("t5", "bart")
    if config.family == "t5":
        assert config.num_layers == hf_config["num_decoder_layers"]
        assert encdec.gated_ffn == (hf_config["feed_forward_proj"] == "gated-gelu")
        assert encdec.scale_decoder_outputs == config.tie_word_embeddings
    else:
        assert config.num_layers == hf_config["decoder_layers"]
        assert config.head_dim * config.num_heads == hf_config["d_model"]
        assert encdec.pre_norm == (hf_config["model_type"] == "mbart")
