"""The OpenAI-compatible API: /v1/completions, /v1/chat/completions, /v1/models, /tokenize and
/detokenize.

Layout: `protocol.py` (request bodies) -> `params.py` (bodies -> SamplingParams) -> `job.py`
(a request in flight) -> `serving.py` (admit, answer as JSON or SSE) with one serving class per
route (`serving_completions.py`, `serving_chat.py`; chat reads its text through
`chat_output.py`, `reasoning.py` and `tool_calls/`) -> `router.py` (the routes). It builds on
the shared pieces of server/ and never on server/tgi/.
"""
