"""The text-generation-inference (TGI) API: /generate, /generate_stream, POST / and /info.

Layout: `protocol.py` (request body, response and event shapes) -> `params.py` (parameters ->
SamplingParams) -> `serving.py` (answers and stream events) -> `router.py` (the routes). It
builds on the shared pieces of server/ and never on server/openai/.
"""
