"""The routed experts on a CPU through tgserve's C++ linear kernel (models/cpu_kernels).

Contract: `use_cpp_experts(model)` packs every `GroupedExperts` of a model on a CPU, expert by
expert (`pack_linear` of its [2I, H] gate-up and [H, I] down rows: a second copy of the
expert weights, as the fused C++ step keeps for dense layers), and points its `run_expert` at
the C++ `linear` over them; it returns how many it switched (0 when the kernels cannot be
built: the reference keeps running). The grouping, the activation and the weighted sum stay
`GroupedExperts.forward`'s. Batch invariance: linear.cpp's reduction order over K is fixed by
K alone, so an expert's row does not depend on the other rows sent to that expert.
"""

from __future__ import annotations

import torch
from torch import nn

from models import cpu_kernels, pointwise
from models.moe.experts import GroupedExperts


class CppExpertRunner:
    """`run_expert(e, x [m, H]) -> [m, H]` over per-expert packed weights."""

    def __init__(self, experts: GroupedExperts, ext) -> None:
        self.ext = ext
        self.intermediate, self.hidden = experts.intermediate, experts.hidden
        with torch.no_grad():
            self.gate_up = [ext.pack_linear(experts.gate_up(e).contiguous())
                            for e in range(experts.num_experts)]  # fmt: skip
            self.down = [ext.pack_linear(experts.down(e).contiguous())
                         for e in range(experts.num_experts)]  # fmt: skip
        self.packed_bytes = sum(p.nbytes for p in self.gate_up + self.down)

    def __call__(self, e: int, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.ext.linear(x.contiguous(), self.gate_up[e], None, 2 * self.intermediate,
                                  False)  # fmt: skip
        gate, up = gate_up.split(self.intermediate, dim=-1)
        act = (pointwise.silu(gate) * up).contiguous()
        return self.ext.linear(act, self.down[e], None, self.hidden, False)


def use_cpp_experts(model: nn.Module) -> int:
    # GGUF blocks kept as stored (models/moe/stored_experts.py) run their block kernels already.
    groups = [m for m in model.modules() if type(m) is GroupedExperts]
    if not groups or groups[0].gate_up_proj.weight.device.type != "cpu":
        return 0
    dtype = groups[0].gate_up_proj.weight.dtype
    ext = cpu_kernels.extension() if dtype in (torch.float32, torch.bfloat16) else None
    if ext is None:
        return 0
    for experts in groups:
        experts.run_expert = CppExpertRunner(experts, ext)  # shadows the reference method
    return len(groups)
