"""CUDA graphs for decode steps: batch-size buckets (buckets.py) and the capture / replay of
one graph per bucket (decode_graphs.py). What a graph reads (the persistent decode buffers and
their capture / replay builders) belongs to the forward path's attention backend
(models/attention_backend.py, models/decode_buffers.py). The model runner is their only user;
`EngineConfig.enforce_eager` (the `--enforce-eager` flag) turns them off, and on CPU nothing is
captured."""
