"""`tgserve bench`: latency, throughput and serving benchmarks, side by side with peer engines.

Layout: workload.py (seeded request sets), model_source.py / model_shapes.py (which weights and
what they cost), random_models.py (`random:` shapes) and synthetic_tokenizer.py (their stand-in
tokenizer for serving), machine_limits.py (bandwidth, by the C++ read probe, and matmul bounds;
device_limits.py measures a GPU's),
decode_layers.py (a GGUF's decode step matrix by matrix, run with `python -m`), backends/ (the Backend seam in
its `__init__`, and tgserve, transformers, vLLM, llama.cpp with its batcher and GGUF rewrite),
latency.py / throughput.py (offline benchmarks), serve_load.py / serve_metrics.py (streaming load
on a running server), kv_usage.py (tgserve's KV cache figures), report.py / progress.py (output).
The command is cli.py (its arguments) and commands.py (what each subcommand runs); gpu_check/ is
the one-command GPU check (`tgserve bench gpu-check`, gpu/check.sh).
Dependency direction: bench/ may import server, engine and models; server/ imports bench only
lazily, when `tgserve bench` runs (server/cli.py). Nothing here imports torch at module level:
the measuring functions import it when they run.
"""
