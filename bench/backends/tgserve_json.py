"""tgserve with every request under a JSON schema (structured outputs), for the throughput bench.

Contract (see bench.backends): as the `tgserve` backend, plus `structured_output` = the JSON
schema of `--json-schema FILE` on every request. For the counts to match the unconstrained run
the schema must not be able to end within `output_len` tokens (bench/schemas/records.json asks
for at least 1000 records): each request then decodes its full count, every token masked, and
`--backend tgserve --backend tgserve-json` compares the two in one command.
"""

from __future__ import annotations

import dataclasses

from bench.backends import BackendOptions
from bench.backends import tgserve as plain
from bench.model_source import ModelSource


class TgserveJsonBackend(plain.TgserveBackend):
    name = "tgserve-json"

    def __init__(self, engine, schema_text: str) -> None:
        from engine import StructuredOutput

        super().__init__(engine)
        self.structured_output = StructuredOutput("json_schema", schema_text)
        self.note += ", every request under a JSON schema"

    def _params(self, output_len: int):
        params = super()._params(output_len)
        return dataclasses.replace(params, structured_output=self.structured_output)


def load(source: ModelSource, options: BackendOptions) -> TgserveJsonBackend:
    if options.json_schema is None:
        raise ValueError("the tgserve-json backend needs --json-schema FILE")
    return TgserveJsonBackend(plain.load(source, options).engine, options.json_schema)
