"""Encoder-decoder models (T5 v1.0 / v1.1 / flan, BART, mBART): their config, attention and
model files. The KV cache is the decoder's: per decoder layer the paged cache of
models/attention.py, holding both the decoder's self-attention K/V and, in blocks of their own
that a request owns, the cross-attention K/V its encoder pass wrote once.

Modules: `config` (config.json -> the encoder-decoder fields of ModelConfig), `attention`
(per-sequence attention with a position bias, over rows or paged; `SeqSpans`), `layers` (the
multi-head attention and activations both families use), `staged_encoder` (the encoder run
layer-major in bounded units, so a long input is chunked like any prefill), `t5`, `bart`.
Every model here has `encode`, `write_cross_kv`, `forward`, `compute_logits` and
`load_weights` (the contract is written in models/encdec/t5.py), and the encoder methods of
`staged_encoder.EncoderStack`. Nothing is imported here:
models/config.py imports `config` while the models import models/config.py.
"""
