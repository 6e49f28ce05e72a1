"""Another tgserve checkout (the previous build) as a backend, so a change is measured against
the build before it in one command.

Interface: `--backend tgserve-baseline --baseline-tree PATH` (BackendOptions.baseline_tree), where
PATH is a checkout of tgserve at any commit, e.g. `git worktree add /tmp/base 32957a0`:
    tgserve bench throughput --backend tgserve --backend tgserve-baseline --baseline-tree /tmp/base

Contract (see bench.backends): two copies of `engine` / `models` / `server` cannot live in one
Python process, so the tree runs in a subprocess of its own: `tree_worker.py` (a standalone
script, started by path with cwd and PYTHONPATH = the tree) imports the TREE's own tgserve backend
(either bench layout), builds the tree's `ModelSource` from the same model path and the tree's
`BackendOptions` from the same values (fields the tree does not know are dropped, with a warning
when they are set), loads the model once, then runs each latency / throughput call there. Timings
are taken inside the worker, around the tree's own calls, so the pipe is not timed. Plain JSON
crosses the pipe and is rebuilt here as LatencySample / ThroughputSample (`kv_cache` as
KvCacheFigures when the tree's figures have every field this tree's have, else None).
`on_finished` follows the worker's progress lines. `name` says which commit ran
(`tgserve@32957a0`, `-dirty` with uncommitted changes to tracked files), `note` is the tree's
backend note and the tree's path. A missing folder, or one without a tgserve bench backend, raises
BackendUnavailable; the worker's errors are raised here as RuntimeError with its message (its
traceback and everything the tree prints go to stderr).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.backends import BackendOptions, BackendUnavailable, LatencySample, ThroughputSample
from bench.kv_usage import KvCacheFigures
from bench.model_source import ModelSource
from bench.workload import BenchRequest

WORKER = Path(__file__).resolve().with_name("tree_worker.py")


class BaselineTreeBackend:
    def __init__(self, tree: Path) -> None:
        self.tree = tree
        self.name = f"tgserve@{_revision(tree)}"
        self.note = ""
        self._process: subprocess.Popen[str] | None = subprocess.Popen(
            [sys.executable, str(WORKER)],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},  # the tree's packages, nothing of ours
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            encoding="utf-8",
        )

    def _call(self, message: dict[str, Any], on_progress: Callable[[int], None] | None = None):
        process = self._process
        if process is None or process.stdin is None or process.stdout is None:
            raise RuntimeError(f"the baseline worker for {self.tree} is closed")
        process.stdin.write(json.dumps(message) + "\n")
        process.stdin.flush()
        while True:
            line = process.stdout.readline()
            if not line:
                raise RuntimeError(
                    f"the baseline worker for {self.tree} exited (code {process.wait()}) "
                    f"during {message['cmd']!r}; its stderr says why"
                )
            reply = json.loads(line)
            if "progress" in reply:
                if on_progress is not None:
                    on_progress(int(reply["progress"]))
                continue
            if not reply["ok"]:
                raise RuntimeError(f"baseline tree {self.tree}: {reply['error']}")
            return reply["result"]

    def load(self, source: ModelSource, options: BackendOptions) -> None:
        values = {k: v for k, v in dataclasses.asdict(options).items() if k != "baseline_tree"}
        threads = sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None
        try:
            info = self._call(
                {"cmd": "load", "model": str(source.path), "options": values, "threads": threads}
            )
        except RuntimeError as exc:
            self.close()
            raise BackendUnavailable(f"--baseline-tree: {exc}") from exc
        defaults = {f.name: f.default for f in dataclasses.fields(BackendOptions)}
        dropped = [
            f"{k}={values[k]!r}" for k in info["ignored_options"] if values[k] != defaults[k]
        ]
        if dropped:
            print(
                f"warning: {self.name} ({info['layout']} layout) has no option for "
                f"{', '.join(dropped)}; it runs without them",
                file=sys.stderr,
            )
        self.note = f"{info['note']}; tree {self.tree}"

    def run_latency(self, request: BenchRequest) -> LatencySample:
        return LatencySample(**self._call({"cmd": "latency", "request": _plain(request)}))

    def run_throughput(
        self, requests: Sequence[BenchRequest], on_finished: Callable[[int], None]
    ) -> ThroughputSample:
        message = {"cmd": "throughput", "requests": [_plain(r) for r in requests]}
        result = self._call(message, on_finished)
        kv = _kv_figures(result.pop("kv_cache", None))
        return ThroughputSample(**result, kv_cache=kv)

    def close(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        try:
            if process.poll() is None and process.stdin is not None:
                process.stdin.write(json.dumps({"cmd": "close"}) + "\n")
                process.stdin.close()
            process.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()


def _plain(request: BenchRequest) -> dict[str, Any]:
    return {"prompt_token_ids": list(request.prompt_token_ids), "output_len": request.output_len}


def _kv_figures(data: dict[str, Any] | None) -> KvCacheFigures | None:
    names = {f.name for f in dataclasses.fields(KvCacheFigures)}
    if not data or not names <= set(data):
        return None
    return KvCacheFigures(**{k: data[k] for k in names})


def _revision(tree: Path) -> str:
    """`32957a0`, `32957a0-dirty`, or the folder's name when it is no git checkout."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(tree), *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        revision = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return tree.name
    return revision + ("-dirty" if dirty else "")


def load(source: ModelSource, options: BackendOptions) -> BaselineTreeBackend:
    if not options.baseline_tree:
        raise ValueError(
            "--backend tgserve-baseline needs --baseline-tree PATH: a checkout of the build to "
            "compare against (e.g. `git worktree add /tmp/base COMMIT`)"
        )
    tree = Path(options.baseline_tree).expanduser().resolve()
    if not tree.is_dir():
        raise BackendUnavailable(
            f"--baseline-tree {tree}: no such folder; make one with "
            "`git worktree add /tmp/base COMMIT` in a tgserve checkout"
        )
    backend = BaselineTreeBackend(tree)
    backend.load(source, options)
    return backend
