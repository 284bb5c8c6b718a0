"""Superseded results: an older result of a named tool, called again with the same arguments, points to the newer one.

Near-lossless, so opt-in per tool: only the operator knows which tools are idempotent reads (`read_file`,
`list_dir`), whose older output is only an earlier state of what the newer call returned.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from proxy.engine.messages import canonical_json_text, tool_name_of_call
from proxy.engine.plan import EditPlan
from proxy.engine.strategies.references import ResultReferences
from proxy.engine.transcript import Transcript

DEFAULT_REFERENCE = (
    "[Superseded by the later call `{tool_name}` ({call_id}) below with the same arguments; call it again for the"
    " current state.]"
)


class SupersededResults(ResultReferences):
    """Replaces older results of the named tools with a reference to the newest call with the same arguments.

    :param tools: The tool names whose results a newer call with the same arguments supersedes. Empty: nothing is.
    :param reference: The text left in place of an older result; `{tool_name}` and `{call_id}` name the later call.
    """

    name = "superseded_results"

    def __init__(self, tools: Iterable[str] = (), *, reference: str = DEFAULT_REFERENCE) -> None:
        super().__init__(reference)
        self.tools = frozenset(tools)

    def plan(self, transcript: Transcript, target_tokens: int) -> EditPlan | None:
        """None at once when no tool is named (the default chain holds this strategy inert); else as every strategy."""
        return super().plan(transcript, target_tokens) if self.tools else None

    def _moves(self, transcript: Transcript, index: int, key: Hashable, call: Mapping[str, Any] | None) -> bool:
        # Any reference from an older call of the same tool with the same arguments is superseded by the newer call.
        return self._key(transcript, index, call) == key

    def _key(self, transcript: Transcript, index: int, call: Mapping[str, Any] | None) -> Hashable | None:
        if call is None:
            return None
        name = tool_name_of_call(call)
        if name not in self.tools:
            return None
        function = call.get("function")
        arguments = function.get("arguments") if isinstance(function, Mapping) else None
        return (name, canonical_json_text(arguments)) if isinstance(arguments, str) else None
