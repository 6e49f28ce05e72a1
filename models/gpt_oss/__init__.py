"""gpt-oss (GptOssForCausalLM): one module per job.

- `experts.py`: the router with bias (top-k over logits, then softmax over the k) and the
  experts with biases and the clamped SwiGLU, gate and up rows interleaved as stored;
- `model.py`: the decoder (attention sinks, alternating sliding / full layers, q/k/v/o
  biases, YaRN rope) and its weight names;
- `mxfp4.py`: the MXFP4 expert tensors of the released checkpoints, dequantised at load.
"""
