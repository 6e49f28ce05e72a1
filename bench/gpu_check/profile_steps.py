"""`python -m bench.gpu_check.profile_steps`: where a decode step's time goes, per batch size,
and where a prompt's prefill step's time goes.

Contract: loads tgserve's bench backend once (`--model`, `--dtype`, `--device`), and for each
`--batches` B submits B greedy requests of a `--prompt-len`-token prompt, steps until every
prompt is prefilled (one token out per request), times `--steps` decode steps on the wall clock
(device synchronized), then records `--steps` more under torch.profiler. With `--prefill-len
P` it then runs `--prefill-repeats` lone requests of a fresh P-token prompt (one output token:
the step is the prefill alone), timed, and as many again under the profiler. Prints one JSON
line `{"kind": "profile", "note", "batches": [...], "prefill": {...} | None}`; per batch (and
for the prefill, per step): wall ms per step, device kernel ms per step (None on a CPU), the
fraction of the wall time the device computes, profiler CPU ms per step, kernel launches per
step, and the top kernels (or CPU ops on a CPU) by self time; the batches also carry their
`context` (prompt length).
"""

from __future__ import annotations

import argparse
import json
import time

TOP = 10


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="profile_steps")
    p.add_argument("--model", required=True)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    p.add_argument("--prompt-len", type=int, default=64, help="the decode batches' prompts")
    p.add_argument("--prefill-len", type=int, default=0, help="0: no prefill profile")
    p.add_argument("--prefill-repeats", type=int, default=3)
    p.add_argument("--disable-cpu-kernels", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import torch

    from bench.backends import BackendOptions, load_backend
    from bench.model_source import resolve_model

    args = _args(argv)
    biggest = max(args.batches)
    options = BackendOptions(
        dtype=args.dtype,
        max_num_seqs=biggest,
        max_num_batched_tokens=max(2048, args.prompt_len, args.prefill_len),
        hf_batch_size=1,
        enable_prefix_caching=False,
        max_model_len=max(args.prompt_len + 2 * args.steps, args.prefill_len) + 8,
        num_requests=biggest,
        cpu_kernels=not args.disable_cpu_kernels,
        device=args.device,
    )
    backend = load_backend("tgserve", resolve_model(args.model), options)
    engine = backend.engine
    cuda = torch.device(args.device).type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    batches = [
        _profile_batch(engine, b, args.prompt_len, args.steps, cuda, sync) for b in args.batches
    ]
    prefill = None
    if args.prefill_len:
        prefill = _profile_prefill(engine, args.prefill_len, args.prefill_repeats, cuda, sync)
    out = {"kind": "profile", "note": backend.note, "batches": batches, "prefill": prefill}
    print(json.dumps(out))
    return 0


def _profile_batch(engine, batch: int, prompt_len: int, steps: int, cuda: bool, sync) -> dict:
    from engine import SamplingParams

    params = SamplingParams(max_tokens=2 * steps + 4, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        prompt = [(7 * i + j) % 500 + 10 for j in range(prompt_len)]
        engine.add_request(f"profile-{batch}-{i}", prompt, params)
    started: set[str] = set()
    while len(started) < batch:  # prefill: until every request has its first token
        for out in engine.step():
            if out.outputs[0].token_ids:
                started.add(out.request_id)
    figures = _timed_then_profiled(engine.step, steps, cuda, sync)
    while engine.has_unfinished_requests():
        engine.step()
    return {"batch": batch, "context": prompt_len, **figures}


def _profile_prefill(engine, length: int, repeats: int, cuda: bool, sync) -> dict:
    """Lone requests of a fresh `length`-token prompt and one output token: each is one step
    of prefill (the budget holds the whole prompt), timed and then profiled."""
    from engine import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    counter = iter(range(10**6))

    def one_prefill() -> None:
        n = next(counter)
        prompt = [(13 * n + 5 * j) % 900 + 10 for j in range(length)]
        engine.add_request(f"prefill-{n}", prompt, params)
        while engine.has_unfinished_requests():
            engine.step()

    one_prefill()  # warm-up: kernels compiled and tuned for this shape
    return {"tokens": length, **_timed_then_profiled(one_prefill, repeats, cuda, sync)}


def _timed_then_profiled(run, times: int, cuda: bool, sync) -> dict:
    """`run()` `times` times on the wall clock (device synchronized), then `times` more under
    torch.profiler: wall ms per run and the profile's summary."""
    from torch.profiler import ProfilerActivity, profile

    sync()
    t0 = time.perf_counter()
    for _ in range(times):
        run()
    sync()
    wall_ms = 1e3 * (time.perf_counter() - t0) / times
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(times):
            run()
        sync()
    return {"wall_ms_per_step": wall_ms, **_summary(prof, times, cuda, wall_ms)}


def _summary(prof, steps: int, cuda: bool, wall_ms: float) -> dict:
    from torch.autograd import DeviceType

    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    cpu_ops = [e for e in events if e.device_type == DeviceType.CPU]
    cpu_ms = sum(e.self_cpu_time_total for e in cpu_ops) / 1e3 / steps
    if cuda:
        device_ms = sum(e.self_device_time_total for e in kernels) / 1e3 / steps
        ranked = sorted(kernels, key=lambda e: e.self_device_time_total, reverse=True)
        top = [_row(e, e.self_device_time_total, steps) for e in ranked[:TOP]]
        launches = sum(e.count for e in kernels) / steps
    else:
        device_ms, launches = None, None
        ranked = sorted(cpu_ops, key=lambda e: e.self_cpu_time_total, reverse=True)
        top = [_row(e, e.self_cpu_time_total, steps) for e in ranked[:TOP]]
    return {
        "device_kernel_ms_per_step": device_ms,
        "device_busy_fraction": device_ms / wall_ms if device_ms is not None else None,
        "profiled_cpu_ms_per_step": cpu_ms,
        "kernel_launches_per_step": launches,
        "top": top,
    }


def _row(event, self_us: float, steps: int) -> dict:
    return {
        "name": event.key[:90],
        "ms_per_step": self_us / 1e3 / steps,
        "calls_per_step": event.count / steps,
    }


if __name__ == "__main__":
    raise SystemExit(main())
