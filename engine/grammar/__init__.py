"""Structured-output grammars: compiled (grammar_compiler, off the engine's thread, into
grammar_cache) and masked on the host (grammar_engine, grammar_masker, grammar_tokenizer)
while the forward runs, handed to the runner as host bitmasks (host_mask), which the sampler
below the runner applies as a `TokenMask` (token_mask). Two floors share this room
(tests/engine/test_import_layers.py places each module): host_mask and token_mask sit below the
runner with the sampler; the rest above the requests.
"""
