"""`python -m bench.gpu_check.environment`: what the check runs on, as one JSON line.

Contract: prints `{"kind": "environment", ...}` with the GPU as nvidia-smi names it (name, memory,
driver, clocks; an `nvidia_smi` error string where it is missing), what torch sees (version, CUDA
version, device name, capability, multiprocessors), the versions of triton, transformers and the
serving packages (None when not importable), Python, the host CPU's model and the ISA flags the
C++ kernels choose by (their results can depend on them), CPU count and the load average. Never
fails for a missing piece: the report shows what is there.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import subprocess

PACKAGES = ("triton", "transformers", "fastapi", "uvicorn", "pydantic", "llguidance", "gguf")
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vbmi", "avx512_vnni", "avx512_bf16")
ISA_FLAGS += ("avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "avx_vnni")
SMI_FIELDS = "name,memory.total,driver_version,clocks.sm,clocks.mem,temperature.gpu"


def nvidia_smi() -> dict[str, str]:
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"nvidia_smi": f"unavailable: {exc}"}
    if out.returncode != 0:
        return {"nvidia_smi": f"rc {out.returncode}: {out.stderr.strip()[:200]}"}
    first = out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
    return dict(zip(SMI_FIELDS.split(","), (v.strip() for v in first.split(",")), strict=False))


def host_cpu() -> dict[str, object]:
    """The CPU's model name and which of ISA_FLAGS it has (models/cpu_features.py reads them)."""
    try:
        from models.cpu_features import cpu_flags, cpu_model_name
    except Exception as exc:  # torch or the package missing: the report says so
        return {"cpu": f"unavailable: {type(exc).__name__}: {exc}"}
    have = set(cpu_flags())
    return {"cpu": cpu_model_name() or "?", "cpu_isa": [f for f in ISA_FLAGS if f in have]}


def torch_facts() -> dict[str, object]:
    import torch

    facts: dict[str, object] = {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
    facts["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(
            device_name=props.name,
            capability=f"{props.major}.{props.minor}",
            multiprocessors=props.multi_processor_count,
            memory_gib=round(props.total_memory / 2**30, 1),
        )
    return facts


def version(name: str) -> str | None:
    try:
        return getattr(importlib.import_module(name), "__version__", "?")
    except Exception:  # not installed, or broken: the report says None
        return None


def main() -> int:
    facts: dict[str, object] = {"kind": "environment", "python": platform.python_version()}
    facts.update(nvidia_smi())
    facts.update(host_cpu())
    facts.update(torch_facts())
    facts.update({name: version(name) for name in PACKAGES})
    facts.update(cpus=os.cpu_count(), load_1m=round(os.getloadavg()[0], 2))
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
