"""How much memory the KV cache may take on this device (the one place that asks the OS)."""

from __future__ import annotations

import os

import torch

# On CPU the cache shares RAM with everything else on the host, and zero-filling it touches
# every page: give it at most this much unless the user asks for more explicitly.
CPU_DEFAULT_CAP_BYTES = 2 * 1024**3


def free_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
