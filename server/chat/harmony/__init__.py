"""OpenAI's harmony chat format (gpt-oss): one module per job.

- `render.py`: chat messages (and a request's functions, `typescript.py`) as the harmony prompt;
- `parse.py`: the model's output split into its messages' channels, whole or streamed;
- `output.py`: those channels as an OpenAI assistant message and its stream deltas.
The chat route switches to it when the vocabulary has harmony's special tokens (setup.py).
"""

from server.chat.harmony.output import HarmonyOutputFormat
from server.chat.harmony.render import HARMONY_MARKERS, render_harmony

__all__ = ["HARMONY_MARKERS", "HarmonyOutputFormat", "render_harmony"]
