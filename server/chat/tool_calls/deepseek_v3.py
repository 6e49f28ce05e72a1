"""DeepSeek V3 / R1 / V3.1 tool calls: special-token blocks holding one or more calls.

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

(V3 and R1; V3.1 writes `<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>`.)

Contract (server/chat/tool_calls/tagged.py): a block is calls when its body is one or more
`<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>` elements (whitespace between them), each in either
form, with arguments that are a JSON object (kept as written); else it is content. Both forms
are read whatever the template teaches; `render_calls` and `grammar()` write the one it teaches
(`fenced`: V3 / R1's). The tags are special tokens, so the output keeps special tokens
(`markers`), and a grammar names each by its token id when the tokenizer has it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

from server.chat.tool_calls.base import FunctionSpec, args_json
from server.chat.tool_calls.events import ToolCall
from server.chat.tool_calls.tagged import TaggedBlockParser

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_CALL = re.compile(re.escape(CALL_BEGIN) + r"(.*?)" + re.escape(CALL_END), re.DOTALL)
_FENCED = re.compile(r"function" + re.escape(SEP) + r"([^\n]+)\n```json\n(.*)\n```", re.DOTALL)
_PLAIN = re.compile(r"([^\n<]+)" + re.escape(SEP) + r"(.*)", re.DOTALL)


class DeepSeekV3Parser(TaggedBlockParser):
    name = "deepseek_v3"
    open_tag, close_tag = CALLS_BEGIN, CALLS_END
    markers = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)

    def __init__(self, marker_ids: Mapping[str, int] | None = None, fenced: bool = True) -> None:
        super().__init__()
        self._marker_ids = dict(marker_ids or {})
        self.fenced = fenced

    def read_block(self, body: str) -> tuple[ToolCall, ...] | None:
        calls, at = [], 0
        for match in _CALL.finditer(body):
            if body[at : match.start()].strip():
                return None
            call = _read_call(match.group(1))
            if call is None:
                return None
            calls.append(call)
            at = match.end()
        if body[at:].strip() or not calls:
            return None
        return tuple(calls)

    def render_calls(self, calls: Sequence[ToolCall]) -> str:
        written = "".join(CALL_BEGIN + self._call(c.name, c.arguments) + CALL_END for c in calls)
        return CALLS_BEGIN + written + CALLS_END

    def _call(self, name: str, arguments: str) -> str:
        if self.fenced:
            return f"function{SEP}{name}\n```json\n{arguments}\n```"
        return f"{name}{SEP}{arguments}"

    def grammar(self, tools: Sequence[FunctionSpec], parallel: bool) -> str:
        begin, end = self._marker(CALLS_BEGIN), self._marker(CALLS_END)
        call_begin, call_end, sep = (self._marker(t) for t in (CALL_BEGIN, CALL_END, SEP))
        repeat = "+" if parallel else ""
        rules = [f"start: {begin} (call){repeat} {end}"]
        rules.append("call: " + " | ".join(f"c{i}" for i in range(len(tools))))
        for i, tool in enumerate(tools):
            name = json.dumps(tool.name)
            if self.fenced:
                body = f'"function" {sep} {name} "\\n```json\\n" a{i} "\\n```"'
            else:
                body = f"{name} {sep} a{i}"
            rules.append(f"c{i}: {call_begin} {body} {call_end}")
            rules.append(f"a{i}: {args_json(tool)}")
        return "\n".join(rules) + "\n"

    def _marker(self, text: str) -> str:
        """A tag in a Lark grammar: its special token, or the text when it is not one."""
        return f"<[{self._marker_ids[text]}]>" if text in self._marker_ids else json.dumps(text)


def _read_call(text: str) -> ToolCall | None:
    match = _FENCED.fullmatch(text.strip()) or _PLAIN.fullmatch(text.strip())
    if match is None:
        return None
    arguments = match.group(2).strip()
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        return None
    return ToolCall(match.group(1).strip(), arguments) if isinstance(parsed, dict) else None
