"""`tgserve bench`: latency, throughput and serving benchmarks, side by side with peer engines.

Layout: workload.py (seeded request sets), model_source.py / model_shapes.py (which weights and
what they cost), machine_limits.py (bandwidth and matmul bounds), backends.py and backend_*.py
(tgserve, transformers, vLLM, llama.cpp), latency.py / throughput.py (offline benchmarks),
serve_load.py / serve_metrics.py (streaming load on a running server), kv_usage.py (tgserve's KV
cache figures), report.py / progress.py (output). The command itself is server/bench_command.py.
Nothing here imports torch at module level: the measuring functions import it when they run.
"""
