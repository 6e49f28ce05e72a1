"""Mixture-of-experts layers (Mixtral, Qwen3-MoE, Qwen2-MoE): one module per job.

- `config.py`: the MoE facts of a config.json (`MoeConfig`);
- `router.py`: softmax top-k routing, with or without renormalisation;
- `experts.py`: the experts as one grouped weight per projection and their reference
  computation (tokens grouped by expert), for any device;
- `cpu_experts.py`: the same computation with each expert's rows through the C++ kernels, for
  the PyTorch layers on a CPU (the C++ step runs whole sparse blocks itself:
  models/cpu_kernels/moe_block.h);
- `block.py`: the sparse block (router, experts, optional shared expert with its gate);
- `model.py`: the decoder family whose MLPs are sparse blocks.
"""
