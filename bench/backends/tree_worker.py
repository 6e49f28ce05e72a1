"""Serve another tgserve checkout's own benchmark backend over stdin/stdout (a standalone script).

Run by path, never imported: `python /abs/tree_worker.py` with cwd and PYTHONPATH set to the
checkout under test (the "tree"). It imports only the standard library and the tree's modules, so
it runs in any tree: the current layout (`bench.backends.tgserve`) and the earlier one
(`server.bench.backend_tgserve`) are both known (LAYOUTS); a module counts only when its file is
inside the tree, so an installed tgserve elsewhere can never stand in for it.

Protocol: JSON lines, one per message, plain data only (module paths differ between trees, so no
dataclass crosses the pipe). Every command gets one reply, `{"ok": true, "result": ...}` or
`{"ok": false, "error": "..."}`; `throughput` may send `{"progress": n}` lines before its reply.
- `{"cmd": "load", "model": path, "options": {...}, "threads": n}`: resolve the model with the
  tree's own `resolve_model`, build the tree's `BackendOptions` from the fields it has, load the
  tree's tgserve backend once -> `{"name", "note", "layout", "ignored_options"}`.
- `{"cmd": "latency", "request": {"prompt_token_ids": [...], "output_len": n}}` -> the
  LatencySample's fields.
- `{"cmd": "throughput", "requests": [request, ...]}` -> the ThroughputSample's fields
  (`kv_cache` as a dict, or null).
- `{"cmd": "close"}`: close the backend, reply, exit 0.
Whatever the tree prints (compiler logs, progress) goes to stderr: stdout is the protocol's.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, TextIO

# Where each layout keeps the pieces: the backend module, and the modules defining
# BackendOptions, resolve_model and BenchRequest.
LAYOUTS: dict[str, dict[str, str]] = {
    "bench": {
        "backend": "bench.backends.tgserve",
        "options": "bench.backends",
        "model_source": "bench.model_source",
        "workload": "bench.workload",
    },
    "server.bench": {
        "backend": "server.bench.backend_tgserve",
        "options": "server.bench.backends",
        "model_source": "server.bench.model_source",
        "workload": "server.bench.workload",
    },
}

# The sample fields read back (by name: a tree's samples need not be this tree's dataclasses).
LATENCY_FIELDS = ("prompt_tokens", "output_tokens", "prefill_s", "decode_s")
THROUGHPUT_FIELDS = ("num_requests", "prompt_tokens", "output_tokens", "elapsed_s")
# Values later trees added to an option that an earlier tree spells None: its float activations
# were None ("none" now), and None was its default (what "auto" now names), e.g. cd83ed6 refuses
# "none" and "auto" for activation_quantization.
NONE_SPELLINGS: dict[str, tuple[str, ...]] = {"activation_quantization": ("none", "auto")}


def _module_file(tree: Path, module: str) -> Path | None:
    base = tree.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _import_layout(tree: Path) -> tuple[str, dict[str, Any]]:
    for layout, modules in LAYOUTS.items():
        if _module_file(tree, modules["backend"]) is None:
            continue
        loaded = {role: importlib.import_module(name) for role, name in modules.items()}
        for module in (*loaded.values(), importlib.import_module("engine")):
            if not Path(module.__file__).resolve().is_relative_to(tree):
                raise RuntimeError(
                    f"{module.__name__} was imported from {module.__file__}, not from {tree}"
                )
        return layout, loaded
    tried = ", ".join(m["backend"] for m in LAYOUTS.values())
    raise RuntimeError(f"{tree} holds no tgserve bench backend (looked for {tried})")


def _tree_value(field: dataclasses.Field, value: Any) -> Any:
    """`value` as the tree's option `field` spells it (NONE_SPELLINGS where it defaults to None)."""
    if field.default is None and value in NONE_SPELLINGS.get(field.name, ()):
        return None
    return value


class Worker:
    def __init__(self, tree: Path, out: TextIO) -> None:
        self.tree = tree
        self.out = out
        self.backend: Any = None
        self.modules: dict[str, Any] = {}

    def send(self, message: dict[str, Any]) -> None:
        self.out.write(json.dumps(message) + "\n")
        self.out.flush()

    def load(self, model: str, options: dict[str, Any], threads: int | None) -> dict[str, Any]:
        layout, self.modules = _import_layout(self.tree)
        if threads:
            importlib.import_module("torch").set_num_threads(threads)
        options_cls = self.modules["options"].BackendOptions
        known = {f.name: f for f in dataclasses.fields(options_cls)}
        source = self.modules["model_source"].resolve_model(model)
        tree_options = options_cls(
            **{k: _tree_value(known[k], v) for k, v in options.items() if k in known}
        )
        self.backend = self.modules["backend"].load(source, tree_options)
        return {
            "name": self.backend.name,
            "note": getattr(self.backend, "note", ""),
            "layout": layout,
            "ignored_options": sorted(set(options) - set(known)),
        }

    def _request(self, data: dict[str, Any]) -> Any:
        return self.modules["workload"].BenchRequest(
            tuple(data["prompt_token_ids"]), int(data["output_len"])
        )

    def latency(self, request: dict[str, Any]) -> dict[str, Any]:
        sample = self.backend.run_latency(self._request(request))
        return {name: getattr(sample, name) for name in LATENCY_FIELDS}

    def throughput(self, requests: list[dict[str, Any]]) -> dict[str, Any]:
        batch = [self._request(r) for r in requests]
        sample = self.backend.run_throughput(batch, lambda n: self.send({"progress": n}))
        kv = getattr(sample, "kv_cache", None)
        return {
            **{name: getattr(sample, name) for name in THROUGHPUT_FIELDS},
            "kv_cache": dataclasses.asdict(kv) if dataclasses.is_dataclass(kv) else None,
        }

    def handle(self, message: dict[str, Any]) -> Any:
        cmd = message.get("cmd")
        if cmd == "load":
            return self.load(message["model"], message["options"], message.get("threads"))
        if self.backend is None:
            raise RuntimeError(f"{cmd!r} before a successful 'load'")
        if cmd == "latency":
            return self.latency(message["request"])
        if cmd == "throughput":
            return self.throughput(message["requests"])
        if cmd == "close":
            self.backend.close()
            self.backend = None
            return None
        raise RuntimeError(f"unknown command {cmd!r}")


def main() -> int:
    # The script's own folder (bench/backends of some tree) must not shadow real packages
    # (transformers.py, vllm.py live there): only the tree and site-packages are importable.
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if p and str(Path(p).resolve()) != here]
    tree = Path.cwd().resolve()
    sys.path.insert(0, str(tree))
    # Keep the real stdout for the protocol; anything the tree prints (fd 1 included, e.g. a
    # compiler's output) goes to stderr.
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    worker = Worker(tree, out)
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        try:
            worker.send({"ok": True, "result": worker.handle(message)})
        except Exception as exc:  # reported to the parent, which raises it there
            traceback.print_exc(file=sys.stderr)
            worker.send({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        if message.get("cmd") == "close":
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
