"""gpt-oss (GptOssForCausalLM): one module per job.

- `experts.py`: the router with bias (top-k over logits, then softmax over the k) and the
  experts with biases and the clamped SwiGLU, gate and up rows interleaved as stored;
- `model.py`: the decoder (attention sinks, alternating sliding / full layers, q/k/v/o
  biases, YaRN rope) and its weight names;
- `mxfp4.py`: the MXFP4 expert tensors of the released checkpoints (and GGML's MXFP4 blocks
  read as theirs), dequantised as the model takes them;
- `parallel.py`: tensor parallel for its sparse block;
- `gguf.py`: GGUF files as llama.cpp writes them (architecture "gpt-oss"): config keys and
  tensors back in transformers' names and layouts.
"""
