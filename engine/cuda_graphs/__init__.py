"""CUDA graphs for decode steps: batch-size buckets and padding (buckets.py), the static input
buffers a graph reads (static_inputs.py), and the capture / replay of one graph per bucket
(decode_graphs.py). The model runner is their only user; `EngineConfig.enforce_eager` (the
`--enforce-eager` flag) turns them off, and on CPU nothing is captured."""
