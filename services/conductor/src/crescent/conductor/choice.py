"""One choice of a response: its tokens, as they arrive, turned into what the client sees.

Tokens become text (stop strings honoured, partial characters held back), the text becomes
content or tool calls as the request's tool_choice says, and each token's logprobs are kept in
the endpoint's shape. `push` gives what can be sent now (a ChoiceDelta), so streaming and
whole responses are built from the same steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from crescent.common.messages import TokenLogprobs
from crescent.conductor.flow_state import TokenEvent
from crescent.conductor.logprobs import CompletionLogprobs, chat_content
from crescent.conductor.openai_api import GenerationRequest
from crescent.conductor.text import TextAssembler
from crescent.conductor.tool_calls import HermesParser, ToolCall, new_call_id, parse_forced

FINISH_TOOL_CALLS = "tool_calls"


@dataclass
class ChoiceDelta:
    """What one choice adds to the response now."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)  # calls completed in this delta
    first_call_index: int = 0  # the index of tool_calls[0] among the choice's calls
    arguments: str = ""  # a named function's arguments, as they stream (tool_choice naming one)
    opens_call: bool = False  # the named function's call starts here: send its id and name
    logprobs: Any = None  # the endpoint's shape for this delta's tokens; None when not asked for
    finish_reason: str | None = None

    @property
    def is_empty(self) -> bool:
        return not (
            self.text
            or self.tool_calls
            or self.arguments
            or self.opens_call
            or self.logprobs
            or self.finish_reason
        )


class Choice:
    def __init__(
        self,
        index: int,
        request: GenerationRequest,
        tokenizer,
        prompt_ids: list[int],
        echo_text: str = "",
        prompt_index: int = 0,
    ) -> None:
        self.index = index
        self.prompt_index = prompt_index  # which of a batch's prompts it answers
        self.request = request
        self._tokenizer = tokenizer
        self._prompt_ids = prompt_ids
        self._text = TextAssembler(tokenizer.stream_decoder(), request.stop)
        choice = request.tool_choice
        self._hermes = HermesParser() if choice is not None and choice.mode == "auto" else None
        self._forced_name = (
            choice.name if choice is not None and choice.mode == "function" else None
        )
        self._is_forced = choice is not None and choice.mode != "auto"
        self._forced_text: list[str] = []  # a forced call's output so far
        self._call_id = new_call_id()
        self._echo = echo_text
        self._completion_logprobs = CompletionLogprobs(tokenizer)
        self.num_tokens = 0
        self.finish_reason: str | None = None
        self.tool_calls: list[ToolCall] = []

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def push(self, event: TokenEvent) -> ChoiceDelta:
        """The part of the response `event` makes ready; after the last one, is_finished."""
        self.num_tokens += len(event.token_ids)
        text = self._echo + self._text.push(event.token_ids)
        logprobs = self._logprobs(event)
        self._echo = ""
        finish = "stop" if self._text.is_stopped else event.finish_reason
        if finish is not None:
            text += self._text.finish()
        delta = self._route(text, is_final=finish is not None)
        delta.logprobs = logprobs
        if finish is not None:
            has_calls = bool(self.tool_calls) and self._forced_name is None
            self.finish_reason = FINISH_TOOL_CALLS if has_calls and finish == "stop" else finish
            delta.finish_reason = self.finish_reason
        return delta

    def _route(self, text: str, is_final: bool) -> ChoiceDelta:
        """Text to content, or to tool calls as the tool choice says."""
        if self._forced_name is not None:
            # The call opens with its first arguments, or at the end if there are none.
            opens_call = not self._forced_text and bool(text or is_final)
            if text or opens_call:
                self._forced_text.append(text)
            if is_final:
                self.tool_calls = [
                    ToolCall(self._forced_name, "".join(self._forced_text).strip(), self._call_id)
                ]
            return ChoiceDelta(arguments=text, opens_call=opens_call)
        if self._is_forced:
            self._forced_text.append(text)
            if not is_final:
                return ChoiceDelta()
            text = "".join(self._forced_text)
            self.tool_calls = parse_forced(text, None)
            # Output cut short is no call: the client gets the text as it is.
            return (
                ChoiceDelta(tool_calls=list(self.tool_calls))
                if self.tool_calls
                else ChoiceDelta(text=text)
            )
        if self._hermes is not None:
            content, calls = self._hermes.push(text)
            if is_final:
                rest, more = self._hermes.finish()
                content, calls = content + rest, calls + more
            delta = ChoiceDelta(
                text=content, tool_calls=calls, first_call_index=len(self.tool_calls)
            )
            self.tool_calls += calls
            return delta
        return ChoiceDelta(text=text)

    def _logprobs(self, event: TokenEvent) -> Any:
        if self.request.sampling.logprobs is None:
            return None
        if self.request.api == "completions":
            entries: list[TokenLogprobs | None] = list(event.logprobs)
            token_ids = list(event.token_ids)
            if event.prompt_logprobs is not None and self.request.echo:
                token_ids = self._prompt_ids + token_ids
                entries = [None, *event.prompt_logprobs, *entries]
            return self._completion_logprobs.part(token_ids, entries)
        return chat_content(self._tokenizer, event.token_ids, event.logprobs)

    @property
    def call_id(self) -> str:
        """The id of a named function's call (sent with its first arguments)."""
        return self._call_id
