"""The fake upstream's Responses API: `POST /v1/responses` and `POST /v1/responses/compact`, without the HTTP.

`ResponsesService` takes parsed bodies and returns `response` objects (or raises `OpenAIError`); `OpenAIUpstream`
routes requests to it, records them and streams the answers (`proxy.simulator.responses_stream`). A create request:

1. is validated (`proxy.simulator.responses_items`: shape, unique ids, pairing and reasoning rules, with OpenAI's
   error bodies), and every `encrypted_content` must be one this fake issued, unaltered: "The encrypted content for
   item {id} could not be verified. Reason: Encrypted content could not be decrypted or parsed." (param null, code
   `invalid_encrypted_content`);
   Request-level checks come first (`proxy.simulator.responses_request`);
2. continues a stored response when it names `previous_response_id`: that response's seen input and output come
   first ("Previous response with id '{id}' not found." with code `previous_response_not_found` otherwise); or a
   conversation (`POST /v1/conversations`) when it names `conversation`: its items come first, and the input and
   output are added to it ("Conversation with id '{id}' not found.", status 404, otherwise);
   `item_reference` items are replaced by the stored item they name ("Item with id '{id}' not found.", 404);
3. is counted over the items the model sees (`proxy.simulator.responses_tokens`); over the window (less
   `max_output_tokens`) it is refused with OpenAI's overflow body ("Your input exceeds the context window of this
   model. Please adjust your input and try again.", param `input`, code `context_length_exceeded`), unless
   `truncation: "auto"` drops the oldest items until it fits;
4. with `context_management: [{"type": "compaction", "compact_threshold": N}]` and more than N input tokens, is
   compacted first: the output starts with a `compaction` item standing for everything seen so far, costing a tenth
   of it (`COMPACTION_RATIO`) as input later, and the model answers from that item alone. Its tokens count as output;
5. is answered by the responder, with prompt caching by the prefix rule (`PromptCache`) for `cached_tokens`;
6. is stored (bounded, oldest forgotten first) unless `store` is false. Ids of issued items are remembered either
   way (bounded too), since the reasoning rules apply to `store: false` conversations as well.

`/v1/responses/input_tokens` answers what a create request would count, without answering it.

`/v1/responses/compact` returns the compacted window: every user message seen, then one compaction item standing
for the rest (which keeps those user messages seen when the window is sent back), with usage for the pass.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from proxy.simulator.openai_common import OpenAIError, invalid_type, missing_parameter
from proxy.simulator.openai_tokens import PromptCache, encoding_name_for_model
from proxy.simulator.responses_api import (
    ResponsesReply,
    ResponsesResponder,
    build_output,
    compaction_item,
    default_responses_responder,
    fake_id,
    limit_reply,
    response_object,
    responses_usage,
)
from proxy.simulator.responses_items import (
    ItemOrigin,
    check_pairing,
    check_reasoning,
    check_unique_ids,
    item_type,
    normalize_input,
)
from proxy.simulator.responses_request import check_not_empty, validate_create_request
from proxy.simulator.responses_tokens import opaque_header, prompt_sequence, truncate_to_fit, visible_items

__all__ = ["COMPACTION_RATIO", "ResponsesService", "context_window_error"]

COMPACTION_RATIO = 10
"""A compaction item costs 1/COMPACTION_RATIO of the input tokens it stands for (at least 1)."""


def context_window_error() -> OpenAIError:
    """OpenAI's Responses API overflow error."""
    return OpenAIError(
        "Your input exceeds the context window of this model. Please adjust your input and try again.",
        param="input",
        code="context_length_exceeded",
    )


class ResponsesService:
    """The state and logic of the fake's Responses API (see the module docstring).

    :param prompt_cache: The upstream's simulated prompt cache (shared with chat completions, scoped by model).
    :param window_for: The context window of a model.
    :param max_remembered: Bound on remembered issued item ids and stored items (oldest forgotten first).
    :param max_stored: Bound on stored responses.
    """

    def __init__(
        self,
        prompt_cache: PromptCache,
        window_for: Callable[[str], int],
        *,
        max_remembered: int = 100_000,
        max_stored: int = 1_000,
    ) -> None:
        self.responder: ResponsesResponder = default_responses_responder
        self._cache = prompt_cache
        self._window_for = window_for
        self._origins: OrderedDict[str, ItemOrigin] = OrderedDict()
        self._items: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._stored: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self._conversations: dict[str, list[dict[str, Any]]] = {}
        self._max_remembered = max_remembered
        self._max_stored = max_stored
        self._serial = itertools.count(1)
        self.compactions = 0
        """Create requests compacted by their `context_management`."""

    def clear(self) -> None:
        """Forget stored responses, conversations and issued ids."""
        self._conversations.clear()
        self._origins.clear()
        self._items.clear()
        self._stored.clear()

    def new_response_id(self) -> str:
        """A fresh `resp_...` id."""
        return fake_id("resp", next(self._serial))

    def create(
        self,
        body: dict[str, Any],
        response_id: str,
        misreport: Mapping[str, int],
        *,
        socket: dict[str, list[dict[str, Any]]] | None = None,
        generate: bool = True,
    ) -> dict[str, Any]:
        """Answer a create request with a finished `response` object, or raise OpenAI's error for it.

        :param socket: The connection-local cache of a WebSocket the request came on: the most recent response's
            items, which `previous_response_id` may name even with `store: false`; replaced by this response's.
        :param generate: False (WebSocket mode's `generate: false`) answers with no output, the state prepared.
        """
        validate_create_request(body)
        model = str(body["model"])
        encoding_name = encoding_name_for_model(model)
        instructions, tools = body.get("instructions"), body.get("tools") or []
        full = self._conversation(body, socket)
        check_not_empty(body)
        seen = visible_items(full)
        budget = self._window_for(model) - int(body.get("max_output_tokens") or 0)
        sequence = prompt_sequence(instructions, tools, seen, encoding_name)
        if len(sequence) > budget and body.get("truncation") == "auto":
            seen = truncate_to_fit(instructions, tools, seen, encoding_name, budget)
            sequence = prompt_sequence(instructions, tools, seen, encoding_name)
        if len(sequence) > budget or not seen:
            raise context_window_error()
        cached = self._cache.cached_tokens(model, sequence)
        compacted: list[dict[str, Any]] = []
        compaction_tokens = 0
        threshold = _compact_threshold(body)
        if threshold is not None and len(sequence) > threshold:
            compaction_tokens = max(1, math.ceil(len(sequence) / COMPACTION_RATIO))
            compacted = [compaction_item(response_id, compaction_tokens, keeps_user_messages=False)]
            self.compactions += 1
        model_view = compacted or [dict(item) for item in seen]
        limit = body.get("max_output_tokens")
        answer_with = self.responder({**body, "input": model_view}) if generate else ResponsesReply()
        reply, cut = limit_reply(answer_with, limit, encoding_name)
        include = body.get("include") or []
        issued = build_output(
            reply,
            response_id,
            encrypted_reasoning="reasoning.encrypted_content" in include,
            encoding_name=encoding_name,
            incomplete=cut,
        )
        output = [*compacted, *issued.items]
        usage = responses_usage(
            len(sequence), cached, issued.output_tokens + compaction_tokens, issued.reasoning_tokens
        )
        self._remember(issued.origins, output if body.get("store", True) else [])
        conversation = self._keep(body, response_id, [*map(dict, seen), *output], socket)
        if conversation is not None:
            self._conversations[conversation] += [*normalize_input(body["input"]), *output]
        status, reason = ("incomplete", "max_output_tokens") if cut else ("completed", None)
        answer = response_object(
            response_id, body, output, {**usage, **misreport}, status=status, incomplete_reason=reason
        )
        return {**answer, "conversation": {"id": conversation}} if conversation is not None else answer

    def _keep(
        self,
        body: Mapping[str, Any],
        response_id: str,
        items: list[dict[str, Any]],
        socket: dict[str, list[dict[str, Any]]] | None,
    ) -> str | None:
        """Store a response's items (unless `store: false`) and a socket's; return the conversation it names."""
        if body.get("store", True):
            self._bounded_put(self._stored, response_id, items, self._max_stored)
        if socket is not None:
            socket.clear()
            socket[response_id] = items
        return _conversation_id(body)

    def count(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer `/v1/responses/input_tokens`: what a create request with this body would count as input."""
        validate_create_request(body)
        seen = visible_items(self._conversation(body))
        check_not_empty(body)
        encoding_name = encoding_name_for_model(str(body["model"]))
        sequence = prompt_sequence(body.get("instructions"), body.get("tools") or [], seen, encoding_name)
        return {"object": "response.input_tokens", "input_tokens": len(sequence)}

    def compact(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer `/v1/responses/compact`: the user messages seen, then one compaction item for the rest."""
        if not body.get("model"):
            raise missing_parameter("model")
        model = str(body["model"])
        encoding_name = encoding_name_for_model(model)
        seen = visible_items(self._conversation(body))
        sequence = prompt_sequence(body.get("instructions"), [], seen, encoding_name)
        if len(sequence) > self._window_for(model):
            raise context_window_error()
        users = [_as_output_message(item) for item in seen if _is_user_message(item)]
        rest = len(sequence) - len(prompt_sequence(None, [], users, encoding_name))
        response_id = self.new_response_id()
        tokens = max(1, math.ceil(rest / COMPACTION_RATIO))
        output = [*users, compaction_item(response_id, tokens, keeps_user_messages=True)]
        cached = self._cache.cached_tokens(model, sequence)
        return {
            "id": response_id,
            "object": "response.compaction",
            "created_at": int(time.time()),
            "output": output,
            "usage": responses_usage(len(sequence), cached, tokens, 0),
        }

    def create_conversation(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer `POST /v1/conversations`: a new conversation holding `items` (checked like `input`)."""
        items = normalize_input(body.get("items") or [])
        conversation_id = fake_id("conv", next(self._serial))
        self._conversations[conversation_id] = items
        created = {"id": conversation_id, "object": "conversation", "created_at": int(time.time())}
        return {**created, "metadata": body.get("metadata") or {}}

    def _conversation(
        self, body: Mapping[str, Any], socket: Mapping[str, list[dict[str, Any]]] | None = None
    ) -> list[dict[str, Any]]:
        """The stored prefix (previous response, from store or socket, or conversation) and the input, checked.

        References are resolved and the pairing, reasoning and encrypted-content rules checked.
        """
        items = [self._resolve(item) for item in normalize_input(body.get("input", []))]
        conversation = _conversation_id(body)
        if conversation is not None:
            if conversation not in self._conversations:
                raise OpenAIError(f"Conversation with id '{conversation}' not found.", status=404)
            items = [*self._conversations[conversation], *items]
        previous = body.get("previous_response_id")
        if previous is not None:
            if not isinstance(previous, str):
                raise invalid_type("previous_response_id", "a string", previous)
            known = self._stored if previous in self._stored else (socket or {})
            if previous not in known:
                raise OpenAIError(
                    f"Previous response with id '{previous}' not found.",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            items = [*known[previous], *items]
        check_unique_ids(items)
        check_pairing(items)
        check_reasoning(items, self._origins)
        _check_encrypted_content(items)
        return items

    def _resolve(self, item: dict[str, Any]) -> dict[str, Any]:
        if item_type(item) != "item_reference":
            return item
        stored = self._items.get(str(item["id"]))
        if stored is None:
            raise OpenAIError(f"Item with id '{item['id']}' not found.", status=404)
        return stored

    def _remember(self, origins: Mapping[str, ItemOrigin], stored_items: list[dict[str, Any]]) -> None:
        for item_id, origin in origins.items():
            self._bounded_put(self._origins, item_id, origin, self._max_remembered)
        for item in stored_items:
            self._bounded_put(self._items, str(item["id"]), item, self._max_remembered)

    @staticmethod
    def _bounded_put(table: OrderedDict[str, Any], key: str, value: Any, bound: int) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > bound:
            table.popitem(last=False)


def _check_encrypted_content(items: list[dict[str, Any]]) -> None:
    """Refuse `encrypted_content` this fake did not issue, or altered, as OpenAI refuses what it cannot decrypt."""
    for item in items:
        content = item.get("encrypted_content")
        if item_type(item) not in ("reasoning", "compaction") or content is None:
            continue
        if not isinstance(content, str) or opaque_header(content) is None:
            text = str(content)
            named = f"for item {item['id']}" if isinstance(item.get("id"), str) else f"{text[:4]}...{text[-4:]}"
            raise OpenAIError(
                f"The encrypted content {named} could not be verified. Reason: Encrypted content could not be "
                "decrypted or parsed.",
                code="invalid_encrypted_content",
            )


def _is_user_message(item: Mapping[str, Any]) -> bool:
    return item_type(item) == "message" and item.get("role") == "user"


def _as_output_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A user message as `/compact` lists it: the long form, its text as `input_text` parts."""
    content = message.get("content")
    parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
    return {"type": "message", "role": "user", "content": parts}


def _conversation_id(body: Mapping[str, Any]) -> str | None:
    """The id of the conversation a request names (a string, or an object with `id`), or None."""
    conversation = body.get("conversation")
    if isinstance(conversation, dict):
        conversation = conversation.get("id")
    if conversation is not None and not isinstance(conversation, str):
        raise invalid_type("conversation", "a string", conversation)
    return conversation


def _compact_threshold(body: Mapping[str, Any]) -> int | None:
    for entry in body.get("context_management") or ():
        if isinstance(entry, dict) and entry.get("type") == "compaction":
            threshold = entry.get("compact_threshold")
            if not isinstance(threshold, int) or isinstance(threshold, bool):
                raise invalid_type("context_management[0].compact_threshold", "an integer", threshold)
            return threshold
    return None
