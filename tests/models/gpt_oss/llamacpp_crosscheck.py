"""A one-off cross-check (not in CI: llama.cpp is no test dependency): llama.cpp itself loads the
gpt-oss GGUFs bench/gpt_oss_gguf.py writes, and its logits match tgserve's on the same file and
transformers' on the folder the file was written from.

Run from tgserve's venv: `python -m tests.models.gpt_oss.llamacpp_crosscheck [--peer-python PATH] [--out DIR]`.
It writes a tiny seeded gpt-oss (4 layers alternating sliding window 8 / full, hidden 64, 4
experts top-2, YaRN factor 4 over 16 positions, SwiGLU limit 7 with gate/up biases that pass
it; the tests' harmony-shaped vocabulary of 461 tokens, tests/models/tokenizer/harmony_vocab.py)
as a folder and as four GGUFs (F32; BF16 matrices, the folder rounded to bfloat16 first; MXFP4
experts written as stored, the rest F32 or Q8_0 as llama-quantize'd files hold it), computes tgserve's logits from each GGUF and transformers' from the
folder, then runs this module again under llama-cpp-python's interpreter (`--peer-python`,
default /work/peer-llamacpp/bin/python: that venv has no torch), which evaluates the same
prompts (`logits_all`) with its default F16 KV cache and with an F32 one, and saves its logits.
Prints one JSON line per file and prompt: the largest |difference| over every logit of every
position between each pair, at how many positions tgserve's and llama.cpp's (default KV) argmax
differ, and the widest top-1 / top-2 gap of tgserve's logits among those (how near a tie).
It lives beside the tests, not in bench/, because it is built from their helpers (the tiny
checkpoint, the harmony vocabulary, the paged driver), which bench/ may not import; nothing
collects it as a test.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

PROMPT_LENGTHS = (5, 20, 40)  # past the window of 8 and YaRN's original 16
CASES = ("F32", "BF16", "MXFP4", "Q8_0+MXFP4")
# each file's type for the matrices that are not MXFP4 experts
MATRICES = {"F32": "F32", "BF16": "BF16", "MXFP4": "F32", "Q8_0+MXFP4": "Q8_0"}


def _prompts(vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(3, vocab, n).tolist() for n in PROMPT_LENGTHS]


def _write_files(out: Path) -> dict[str, Path]:
    import torch

    from bench.gpt_oss_gguf import write_gpt_oss_gguf
    from tests.models.gpt_oss.checkpoint import gguf_checkpoint, save_mxfp4_folder
    from tests.models.tokenizer.harmony_vocab import (
        BPE_SIZE,
        harmony_special_ids,
        save_harmony_tokenizer,
    )

    vocab = BPE_SIZE + len(harmony_special_ids())
    files = {}
    for case in CASES:
        hf = gguf_checkpoint(MATRICES[case], vocab_size=vocab, num_hidden_layers=4)
        folder = out / f"folder-{case}"
        if "MXFP4" in case:
            save_mxfp4_folder(hf, folder, torch.Generator().manual_seed(5))
        else:
            hf.save_pretrained(folder)
        save_harmony_tokenizer(folder)
        files[case] = write_gpt_oss_gguf(folder, out / f"gpt-oss-{case}.gguf", MATRICES[case])
        np.savez(out / f"transformers-{case}.npz", *_transformers_logits(hf, vocab))
        np.savez(out / f"tgserve-{case}.npz", *_tgserve_logits(files[case], vocab))
    return files


def _transformers_logits(hf, vocab: int) -> list[np.ndarray]:
    import torch

    with torch.no_grad():
        return [hf(torch.tensor([p])).logits[0].float().numpy() for p in _prompts(vocab)]


def _tgserve_logits(path: Path, vocab: int) -> list[np.ndarray]:
    from models.loader import load_model
    from tests.models.paged_driver import PagedDriver

    model, _ = load_model(path, "float32", "cpu", use_cache=False)
    out = []
    for prompt in _prompts(vocab):
        driver = PagedDriver(model)
        seq = driver.add_sequence()
        out.append(driver.step({seq: prompt})[seq].float().numpy())
    return out


def _llamacpp_logits(path: Path, vocab: int, kv_type: int) -> list[np.ndarray]:
    """In the peer venv: llama.cpp's logits of every prompt position, one fresh context each,
    its KV cache in GGML type `kv_type` (1: F16, llama.cpp's default; 0: F32)."""
    import llama_cpp

    out = []
    for prompt in _prompts(vocab):
        model = llama_cpp.Llama(
            str(path), logits_all=True, n_ctx=64, n_threads=1, n_batch=64, verbose=False,
            type_k=kv_type, type_v=kv_type,
        )  # fmt: skip
        model.eval(prompt)
        out.append(np.array(model.scores[: len(prompt)], dtype=np.float32))
        model.close()
    return out


def _compare(out: Path, vocab: int) -> list[dict]:
    rows = []
    for case in CASES:
        names = ("tgserve", "llamacpp", "llamacpp_f32kv", "transformers")
        got = {name: list(np.load(out / f"{name}-{case}.npz").values()) for name in names}
        for i, n in enumerate(PROMPT_LENGTHS):
            t, ll, ll32, tf = (got[k][i] for k in names)
            rows.append({
                "file": case, "prompt_tokens": n, "max_abs_logit": float(np.abs(tf).max()),
                "tgserve_vs_llamacpp": float(np.abs(t - ll).max()),
                "tgserve_vs_llamacpp_f32kv": float(np.abs(t - ll32).max()),
                "transformers_vs_llamacpp": float(np.abs(tf - ll).max()),
                "tgserve_vs_transformers": float(np.abs(t - tf).max()),
                "argmax_differs_at": int((t.argmax(-1) != ll.argmax(-1)).sum()),
                "positions": len(t), "top2_gap_where_it_differs": _gap(t, t.argmax(-1) != ll.argmax(-1)),
            })  # fmt: skip
    return rows


def _gap(logits: np.ndarray, where: np.ndarray) -> float | None:
    """The largest top-1 minus top-2 logit among the positions `where` (None if there are none):
    how close to a tie the argmax that changed was."""
    if not where.any():
        return None
    top2 = np.sort(logits[where], axis=-1)[:, -2:]
    return float((top2[:, 1] - top2[:, 0]).max())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer-python", default="/work/peer-llamacpp/bin/python")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--peer", type=Path, help=argparse.SUPPRESS)  # the peer venv's half
    args = parser.parse_args(argv)
    if args.peer is not None:
        vocab = int((args.peer / "vocab").read_text())
        for case in CASES:
            for name, kv_type in (("llamacpp", 1), ("llamacpp_f32kv", 0)):
                logits = _llamacpp_logits(args.peer / f"gpt-oss-{case}.gguf", vocab, kv_type)
                np.savez(args.peer / f"{name}-{case}.npz", *logits)
        return
    out = args.out or Path(tempfile.mkdtemp(prefix="gguf-crosscheck-"))
    out.mkdir(parents=True, exist_ok=True)
    _write_files(out)
    vocab = json.loads((out / "folder-F32" / "config.json").read_text())["vocab_size"]
    (out / "vocab").write_text(str(vocab))
    root = Path(__file__).resolve().parents[3]
    subprocess.run(
        [args.peer_python, "-m", "tests.models.gpt_oss.llamacpp_crosscheck", "--peer", str(out)],
        cwd=root,
        check=True,
    )
    for row in _compare(out, vocab):
        print(json.dumps(row))


if __name__ == "__main__":
    main(sys.argv[1:])
