"""`python -m bench.gpu_check.random_server`: tgserve's HTTP server on a `random:` shape.

Contract: serves `--model random:NAME` (seeded random weights built on the device, and a
synthetic tokenizer, bench/synthetic_tokenizer.py, so every token streams as its own chunk;
prompts are token ids, as `tgserve bench serve` sends them) on 127.0.0.1:`--port`, through the
same app factory and uvicorn runner as `tgserve serve` (server/app.py, server/serve.py), with
`--dtype`, `--device`, `--max-num-seqs`, `--target-itl-ms` and the default engine settings
otherwise. SIGTERM drains at once (no grace period: the check has ended its load by then). For the GPU check's serve stage, where
the 8B shape has no checkpoint to load.
"""

from __future__ import annotations

import argparse
import sys

from bench.random_models import random_shape


def main(argv: list[str] | None = None) -> int:
    from bench.synthetic_tokenizer import synthetic_tokenizer
    from engine import Engine, EngineConfig
    from server.serve import configure_logging, serve_engine
    from server.settings import Settings

    p = argparse.ArgumentParser(prog="random_server")
    p.add_argument("--model", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default="auto")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--disable-cpu-kernels", action="store_true")
    p.add_argument("--target-itl-ms", type=float, default=EngineConfig.target_itl_ms)
    args = p.parse_args(argv)
    name, shape = random_shape(args.model)
    settings = Settings(
        host="127.0.0.1",
        port=args.port,
        served_model_name=(name,),
        dtype=args.dtype,
        device=args.device,
        max_num_seqs=args.max_num_seqs,
        disable_cpu_kernels=args.disable_cpu_kernels,
        shutdown_timeout=0.0,
        log_level="warning",
    )
    config = EngineConfig(
        dtype=args.dtype,
        device=args.device,
        max_num_seqs=args.max_num_seqs,
        max_queued_requests=max(256, 4 * args.max_num_seqs),
        max_model_len=4096,
        cpu_kernels=not args.disable_cpu_kernels,
        target_itl_ms=args.target_itl_ms,
    )
    configure_logging(settings.log_level)

    def load_engine() -> Engine:
        vocab, bos, eos = shape["vocab_size"], shape.get("bos_token_id"), shape.get("eos_token_id")
        tokenizer = synthetic_tokenizer(vocab, bos, eos)
        return Engine.from_random_weights(args.model, shape, config, tokenizer)

    return serve_engine(settings, load_engine, config.max_in_flight)


if __name__ == "__main__":
    sys.exit(main())
