"""A bigger model that agrees with the default model often but not always: the target for
measuring draft-model speculation (the default model drafting) without a download.

Contract: `write_grown_gguf(dest, extra_layers, noise, source=None, seed=0)` writes `dest`, a
Llama GGUF made from `source` (default: the default model's GGUF) and returns it:
- every tensor of `source` is copied byte for byte (same types, same blocks), and every
  metadata field (tokenizer and chat template included), with `block_count` raised;
- `extra_layers` new layers are spread evenly between the source's (after source layer i come
  floor((i + 1) E / L) - floor(i E / L) of them). A new layer copies the norms and the Q, K, V,
  gate and up projections of the source layer before it, and its two output projections (the
  attention output and the MLP down projection, the only paths from a layer into the residual
  stream) are seeded N(0, noise^2) noise stored in the source's type for them. With `noise` 0
  they are exactly zero, each new layer adds nothing, and the grown model computes the source's
  function bit for bit (at the cost of its extra layers); the larger `noise`, the more often the
  grown model's next token differs from the source's, so `noise` sets the acceptance rate of the
  source drafting for it.
Cost: a new layer reads what a source layer reads, so at batch 1 the grown model costs about
(L + E) / L of the source's layers plus the same LM head. `tgserve bench grow-model` writes it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, Keys

from bench.backends.gguf_requant import copy_fields
from bench.random_gguf import stored_values

OUTPUT_PROJECTIONS = ("attn_output", "ffn_down")  # a layer's writes into the residual stream


def write_grown_gguf(
    dest: str | Path,
    extra_layers: int,
    noise: float,
    source: str | Path | None = None,
    seed: int = 0,
) -> Path:
    if extra_layers < 0 or noise < 0:
        raise ValueError(f"--extra-layers and --noise must be >= 0, got {extra_layers}, {noise}")
    if source is None:
        from models.default_model import default_model_path

        source = default_model_path()
    reader = GGUFReader(source)
    arch = str(reader.fields[Keys.General.ARCHITECTURE].contents())
    if arch != "llama":
        raise ValueError(f"{source}: grows Llama GGUFs, this one is {arch!r}")
    count_key = Keys.LLM.BLOCK_COUNT.format(arch=arch)
    layers = int(reader.fields[count_key].contents())
    writer = GGUFWriter(str(dest), arch=arch)
    copy_fields(reader, writer, skip={count_key})
    writer.add_block_count(layers + extra_layers)
    rng = np.random.default_rng(seed)
    plan = _plan(reader, layers, extra_layers)
    for name, tensor, _ in plan:
        shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists dims innermost first
        writer.add_tensor_info(
            name, shape, np.dtype(np.float32), int(tensor.n_bytes), tensor.tensor_type
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, tensor, fresh in plan:
        if not fresh:
            writer.write_tensor_data(tensor.data)
            continue
        shape = tuple(int(d) for d in reversed(tensor.shape))
        values = rng.standard_normal(shape, dtype=np.float32) * np.float32(noise)
        writer.write_tensor_data(stored_values(values, GGMLQuantizationType(tensor.tensor_type)))
    writer.close()
    return Path(dest)


def _plan(reader: GGUFReader, layers: int, extra: int) -> list[tuple[str, object, bool]]:
    """(name in the grown file, the source tensor it copies or takes the shape of, whether its
    values are new noise), in file order: the source's, with the new layers after their
    source layer's tensors."""
    by_layer: dict[int, list] = {}
    for tensor in reader.tensors:
        if tensor.name.startswith("blk."):
            by_layer.setdefault(int(tensor.name.split(".")[1]), []).append(tensor)
    plan: list[tuple[str, object, bool]] = []
    grown = 0  # the grown file's index of the next layer
    layers_done = False
    for tensor in reader.tensors:
        if not tensor.name.startswith("blk."):
            plan.append((tensor.name, tensor, False))
            continue
        if layers_done:
            continue
        layers_done = True  # the source's layers are contiguous in its file: place them all
        for i in range(layers):
            copies = 1 + (i + 1) * extra // layers - i * extra // layers
            for copy in range(copies):
                for t in by_layer[i]:
                    part = t.name.split(".", 2)[2]
                    fresh = copy > 0 and part.split(".")[0] in OUTPUT_PROJECTIONS
                    plan.append((f"blk.{grown}.{part}", t, fresh))
                grown += 1
    return plan
