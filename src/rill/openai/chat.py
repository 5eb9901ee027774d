"""POST /v1/chat/completions: validate, render the chat, run it, answer as JSON or as SSE.

Everything that can fail on the request's own account (schema, model, template, sampling
params, length) fails in `prepare_chat`, before a byte of the response is written; the SSE
stream's role frame therefore always belongs to a request that validated.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from rill.errors import ValidationError
from rill.openai import sse
from rill.openai.chat_media import MediaParts, load_media
from rill.openai.constraints import auto_tools_constraint, output_constraint, tool_call_constraint
from rill.openai.errors import ApiError, bad_request
from rill.openai.forced_prefix import ForcedPrefix, call_start, split_forced_prefix
from rill.openai.logprobs import chat_logprobs
from rill.openai.params import chat_sampling_params
from rill.openai.reasoning_parser import ReasoningStreamer
from rill.openai.requests import ChatCompletionRequest, FunctionDef, Message, NamedToolChoice, Tool
from rill.openai.chat_bodies import (
    ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, ChatDelta, ChatLogprobs, ChatMessage,
    FunctionCallDelta, FunctionCallOut, ToolCallDelta, ToolCallOut, usage,
)
from rill.openai.serving import RequestTrace, Serving, api_error, decode_body, finish_reason, sampling_error
from rill.openai.tool_parser import ToolCallEvent, ToolCallStreamer, coalesce, is_json_object, new_call_id
from rill.outputs import RequestDelta, TokenLogprob
from rill.sampling_params import SamplingParams
from rill.structured import GrammarSpec

Deltas = AsyncIterator[tuple[int, RequestDelta]]  # (prompt index, delta), as Serving.run yields them


@dataclass
class ChatJob:
    """A validated chat request, ready to run."""

    request: ChatCompletionRequest
    trace: RequestTrace
    model: str
    prompt_ids: list[int]
    params: SamplingParams
    parse_tools: bool
    forced: ForcedPrefix | None  # the start of a call when tool_choice forces one
    echo: str
    created: int
    tools: list[dict] | None = None  # as the chat template sees them
    media: MediaParts | None = None  # the prompt's images and videos, still to load (chat_media.py)
    mm_items: tuple = ()  # ... once loaded: placed in prompt_ids, whose placeholders are expanded

    @property
    def tool_prefix(self) -> str:
        """The part of a forced call's start written after the generation prompt (the model writes the
        rest, in its own tokens, as the call's grammar begins)."""
        return self.forced.prompt_text if self.forced else ""

    @property
    def include_usage(self) -> bool:
        return self.request.stream_options is not None and self.request.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and self.request.stream_options.continuous_usage_stats


def prepare_chat(serving: Serving, trace: RequestTrace, body: bytes) -> ChatJob:
    return prepare_chat_request(serving, trace, decode_body(body, ChatCompletionRequest), with_media=True)


def prepare_chat_request(serving: Serving, trace: RequestTrace, req: ChatCompletionRequest,
                         with_media: bool = False) -> ChatJob:
    """A decoded chat request (from the wire, or translated from the Responses API) validated and
    rendered: its prompt_ids set, ready to run (after load_chat_media when it has images)."""
    job = chat_job(serving, trace, req)
    media = serving.media_parts() if with_media else None
    messages = [message_dict(m, i, media) for i, m in enumerate(job.request.messages)]
    text = render_prompt(serving, job, messages)
    serving.check_prompt_text(text, "messages")
    job.prompt_ids = serving.tokenizer.encode(text, add_special_tokens=False)
    job.media = media if media is not None and media.refs else None
    trace.num_prompt_tokens = len(job.prompt_ids)
    serving.check_fits(len(job.prompt_ids), job.params.max_tokens, "messages")
    serving.check_ready()
    return job


async def load_chat_media(serving: Serving, job: ChatJob) -> None:
    """Decode, process and place the job's images and videos (a 400 for a bad one), off the trio thread."""
    if job.media is None:
        return
    job.prompt_ids, items = await load_media(job.prompt_ids, job.media.refs, serving.options.media,
                                             serving.mm_inputs)
    job.mm_items = tuple(items)
    job.trace.num_prompt_tokens = len(job.prompt_ids)
    serving.check_fits(len(job.prompt_ids), job.params.max_tokens, "messages")


def chat_job(serving: Serving, trace: RequestTrace, req: ChatCompletionRequest) -> ChatJob:
    """The checks a chat request passes however its prompt arrives (whole, or streamed in:
    rill.openai.streaming); its prompt_ids are the caller's to fill."""
    model = serving.check_model(req.model)
    tools, forced = _tool_setup(serving, req)
    params = _sampling_params(serving, req)
    serving.check_fan_out(1, params.n)
    params.grammar = serving.compile_grammar(_constraint(serving, req, forced))
    parse_tools = tools is not None and serving.options.tool_call_parser is not None
    return ChatJob(req, trace, model, [], params, parse_tools, forced, _echo(req), int(time.time()), tools)


def render_prompt(serving: Serving, job: ChatJob, messages: list[dict[str, Any]]) -> str:
    """The prompt text of `messages` with the job's template options and forced tool-call start."""
    req = job.request
    text = serving.tokenizer.apply_chat_template(
        messages, tools=job.tools, add_generation_prompt=req.add_generation_prompt,
        chat_template_kwargs=req.chat_template_kwargs, continue_final_message=req.continue_final_message,
    )
    return text + job.tool_prefix


# -- validation --------------------------------------------------------------------------------------------


def _constraint(serving: Serving, req: ChatCompletionRequest, forced: ForcedPrefix | None,
                ) -> tuple[GrammarSpec, str] | None:
    """A forced tool call's grammar, else response_format's or structured_outputs' (a forced call is the
    whole answer, so the format of a text answer does not apply to it), else the declared tools' under
    tool_choice "auto". (A text format wins over tools: a grammar for the one is not yet joined to the
    other's calls.)"""
    if forced is None:
        return output_constraint(req) or _auto_tools(serving, req)
    name = None if req.tool_choice == "required" else req.tool_choice.function.name
    return tool_call_constraint(req.tools, name, forced.output_text, serving.grammars.special_tags)


def _auto_tools(serving: Serving, req: ChatCompletionRequest) -> tuple[GrammarSpec, str] | None:
    """Text or calls to the declared tools with valid arguments, when the template shows tools under
    tool_choice "auto" and a parser reads the calls. Checked before serving.grammars is touched, so
    that requests without tools never build its vocabulary table."""
    auto = req.tool_choice in (None, "auto") and serving.options.tool_call_parser is not None
    if not auto or not req.tools:
        return None
    return auto_tools_constraint(req.tools, req.parallel_tool_calls, serving.grammars.special_tags)


def _sampling_params(serving: Serving, req: ChatCompletionRequest) -> SamplingParams:
    renames = {"logprobs": "top_logprobs"}
    if req.max_completion_tokens is not None:
        renames["max_tokens"] = "max_completion_tokens"
    try:
        params = chat_sampling_params(req, serving.generation_config)
        serving.check_params(params)
    except ValidationError as exc:
        raise sampling_error(exc, renames) from exc
    return params


def _tool_setup(serving: Serving, req: ChatCompletionRequest) -> tuple[list[dict] | None, ForcedPrefix | None]:
    """The tools the template shows, and the start that forces a call (tool_choice required/named),
    cut on a token boundary (rill.openai.forced_prefix)."""
    choice = req.tool_choice
    forced = choice == "required" or isinstance(choice, NamedToolChoice)
    if forced and not req.tools:
        raise bad_request("tool_choice asks for a tool call but the request has no tools", "tool_choice")
    if not req.tools or choice == "none":
        return None, None
    tools = tool_dicts(req.tools)
    if not forced:
        return tools, None
    if serving.options.tool_call_parser is None:
        raise bad_request("tool_choice required or named needs a tool-call parser (--tool-call-parser)",
                          "tool_choice", "unsupported")
    name = None if choice == "required" else choice.function.name
    if name is not None and name not in {t.function.name for t in req.tools}:
        raise bad_request(f"tool_choice names {name!r}, which is not among the tools", "tool_choice")
    return tools, split_forced_prefix(serving.tokenizer, call_start(name))


def tool_dicts(tools: list[Tool]) -> list[dict[str, Any]]:
    """Tools as the chat template sees them (fields the client left out are absent, not null)."""
    return [{"type": "function", "function": _plain_function(t.function)} for t in tools]


def _plain_function(function: FunctionDef) -> dict[str, Any]:
    out = {"name": function.name}
    if function.description is not None:
        out["description"] = function.description
    if function.parameters is not None:
        out["parameters"] = function.parameters
    if function.strict:  # the Agents SDK's shape ends in "strict": true, and rill-tiny was trained on it;
        out["strict"] = True  # false is the default, left out like the other unset fields (LlamaIndex sends it)
    return out


def message_dict(message: Message, i: int, media: MediaParts | None = None) -> dict[str, Any]:
    """A message as the chat template sees it. With `media` (a vision model's chat), content parts stay
    a list of template parts (transformers' shape) and the images and videos are collected."""
    if media is not None and media.accepts and isinstance(message.content, list):
        content = [media.part(p, f"messages[{i}].content[{j}]") for j, p in enumerate(message.content)]
    else:
        content = _content_text(message, i)
    out: dict[str, Any] = {"role": message.role, "content": content}
    for name in ("name", "tool_call_id", "reasoning_content"):
        if getattr(message, name) is not None:
            out[name] = getattr(message, name)
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": c.type, "function": {"name": c.function.name,
                                                      "arguments": _arguments(c.function.arguments)}}
            for c in message.tool_calls
        ]
    return out


def _content_text(message: Message, i: int) -> str | None:
    """Content parts become one text (joined by newlines, as vLLM does); rill's models read only text."""
    if not isinstance(message.content, list):
        return message.content
    for j, part in enumerate(message.content):
        if part.type != "text" or part.text is None:
            raise bad_request(f"content part type {part.type!r} is not supported: this model reads text only",
                              f"messages[{i}].content[{j}].type", "unsupported")
    return "\n".join(part.text for part in message.content)


def _arguments(arguments: str | dict) -> str | dict:
    """Templates expect a call's arguments as an object (transformers); OpenAI sends JSON text."""
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments)
    except (json.JSONDecodeError, RecursionError):
        return arguments
    return parsed if isinstance(parsed, dict) else arguments


def _echo(req: ChatCompletionRequest) -> str:
    last = req.messages[-1] if req.messages else None
    if not req.echo or last is None or last.role != "assistant":
        return ""
    return _content_text(last, len(req.messages) - 1) or ""


# -- one choice's text -> content, reasoning and tool calls ---------------------------------------------------------


class ChoiceStream:
    """Splits one choice's text deltas into reasoning, content and tool-call deltas."""

    def __init__(self, serving: Serving, job: ChatJob, index: int):
        self.index = index
        self.job = job
        self.tokenizer = serving.tokenizer
        parser = serving.options.reasoning_parser
        self.reasoning = ReasoningStreamer(parser) if parser and job.forced is None else None
        self.tools = ToolCallStreamer(None if job.request.parallel_tool_calls else 1) if job.parse_tools else None
        self.call_ids: dict[int, str] = {}
        self.call_arguments: dict[int, str] = {}  # each call's arguments as sent so far
        self.answer = ""  # the text after any reasoning, as written (a call's raw text included)
        self.pending = job.echo + job.tool_prefix  # text fed with the first delta
        self.num_output_tokens = 0
        self._logprobs: list[TokenLogprob] = []  # not yet sent: they ride with the next text

    @property
    def called_tools(self) -> bool:
        """True when the output held calls and every call's arguments parse as a JSON object (read at
        the end: a call whose arguments do not parse makes the answer plain text, see `_choice`)."""
        return bool(self.call_ids) and all(map(is_json_object, self.call_arguments.values()))

    def on_delta(self, delta: RequestDelta) -> ChatDelta:
        text, self.pending = self.pending + delta.text, ""
        self.num_output_tokens = delta.num_output_tokens
        self._logprobs.extend(delta.logprobs or [])
        reasoning, answer = self.reasoning.feed(text) if self.reasoning else ("", text)
        self.answer += answer
        content, events = self.tools.feed(answer) if self.tools else (answer, [])
        if delta.finished:
            reasoning, content, events = self._flush(reasoning, content, events)
        # One entry per call in a chunk, as OpenAI and vLLM send: a call's start carries the
        # arguments that came with it (clients such as LlamaIndex read only the first entry).
        return ChatDelta(content=content or None, reasoning_content=reasoning or None,
                         tool_calls=[self._tool_delta(e) for e in coalesce(events)] or None)

    def _flush(self, reasoning: str, content: str, events: list[ToolCallEvent]):
        if self.reasoning:
            more_reasoning, answer = self.reasoning.finish()
            self.answer += answer
            reasoning += more_reasoning
            more_content, more_events = self.tools.feed(answer) if self.tools else (answer, [])
            content, events = content + more_content, events + more_events
        if self.tools:
            more_content, more_events = self.tools.finish()
            content, events = content + more_content, events + more_events
        return reasoning, content, events

    def _tool_delta(self, event: ToolCallEvent) -> ToolCallDelta:
        self.call_arguments[event.index] = self.call_arguments.get(event.index, "") + event.arguments
        if event.name is None:
            return ToolCallDelta(event.index, function=FunctionCallDelta(arguments=event.arguments))
        call_id = self.call_ids[event.index] = new_call_id()
        return ToolCallDelta(event.index, call_id, "function", FunctionCallDelta(event.name, event.arguments))

    def finish_reason(self, delta: RequestDelta) -> str | None:
        reason = finish_reason(delta)
        return "tool_calls" if reason == "stop" and self.called_tools else reason

    def take_logprobs(self) -> ChatLogprobs | None:
        """The logprobs of the tokens received since the last call (None when not asked for)."""
        if self.job.params.logprobs is None:
            return None
        taken, self._logprobs = self._logprobs, []
        return chat_logprobs(self.tokenizer, taken, self.job.request.top_logprobs or 0)


# -- streaming ------------------------------------------------------------------------------------------------


async def stream_chat(serving: Serving, job: ChatJob, deltas: Deltas | None = None) -> AsyncIterator[bytes]:
    """SSE frames: a role frame per choice, content deltas, a terminal frame per choice, usage, [DONE].
    `deltas` replaces running job.prompt_ids (streamed input brings its own: rill.openai.streaming)."""
    choices = [ChoiceStream(serving, job, i) for i in range(job.params.n)]
    status = 499  # until the stream ends on its own: the client left
    try:
        for i in range(job.params.n):
            yield _frame(job, [ChatChunkChoice(i, ChatDelta(role="assistant"))])
        async with aclosing(deltas or serving.run(job.trace, [job.prompt_ids], job.params, job.mm_items)) as deltas:
            async for _, delta in deltas:
                if delta.error is not None:
                    raise ApiError(500, delta.error, code="engine_error")
                for frame in _delta_frames(job, choices, delta):
                    yield frame
        if job.include_usage:
            yield _frame(job, [], _usage(job, choices))
        yield sse.DONE
        status = 200
    except Exception as exc:  # noqa: BLE001 - the status is sent: the error goes in the stream
        error = api_error(exc)
        status = error.status
        yield sse.error_frame(error)
    finally:
        serving.finish(job.trace, status)


def _delta_frames(job: ChatJob, choices: list[ChoiceStream], delta: RequestDelta) -> list[bytes]:
    choice = choices[delta.index]
    out = choice.on_delta(delta)
    frames = []
    usage_now = _usage(job, choices) if job.continuous_usage else None
    if out != ChatDelta():  # tokens whose text is held back send their logprobs with later text
        frames.append(_frame(job, [ChatChunkChoice(choice.index, out, choice.take_logprobs())], usage_now))
    if delta.finished:
        terminal = ChatChunkChoice(choice.index, ChatDelta(), choice.take_logprobs(), choice.finish_reason(delta))
        frames.append(_frame(job, [terminal], usage_now))
    return frames


def _frame(job: ChatJob, choices: list[ChatChunkChoice], usage_now=None) -> bytes:
    chunk = ChatCompletionChunk(job.trace.request_id, job.created, job.model, choices, usage=usage_now)
    return sse.data_frame(chunk)


def _usage(job: ChatJob, choices: list[ChoiceStream]):
    return usage(len(job.prompt_ids), sum(c.num_output_tokens for c in choices))


# -- one JSON answer ------------------------------------------------------------------------------------------


async def complete_chat(serving: Serving, job: ChatJob, deltas: Deltas | None = None) -> ChatCompletion:
    choices = [ChoiceStream(serving, job, i) for i in range(job.params.n)]
    parts: list[list[ChatDelta]] = [[] for _ in choices]
    ends: list[RequestDelta | None] = [None for _ in choices]
    num_cached = 0
    async with aclosing(deltas or serving.run(job.trace, [job.prompt_ids], job.params, job.mm_items)) as deltas:
        async for _, delta in deltas:
            if delta.error is not None:
                raise ApiError(500, delta.error, code="engine_error")
            parts[delta.index].append(choices[delta.index].on_delta(delta))
            ends[delta.index] = delta
            num_cached = max(num_cached, delta.num_cached_tokens)
    result = [_choice(c, p, e) for c, p, e in zip(choices, parts, ends)]
    total = usage(len(job.prompt_ids), sum(c.num_output_tokens for c in choices), num_cached)
    return ChatCompletion(job.trace.request_id, job.created, job.model, result, total)


def _choice(choice: ChoiceStream, parts: list[ChatDelta], end: RequestDelta) -> ChatChoice:
    """The streamed parts of one choice, joined into its message."""
    content = "".join(p.content or "" for p in parts)
    reasoning = "".join(p.reasoning_content or "" for p in parts) or None
    calls: dict[int, ToolCallOut] = {}
    for part in parts:
        for d in part.tool_calls or []:
            if d.id is not None:
                calls[d.index] = ToolCallOut(d.id, FunctionCallOut(d.function.name, ""))
            calls[d.index].function.arguments += d.function.arguments or ""
    if calls and not choice.called_tools:  # arguments that are not a JSON object: the raw text, as vLLM does
        calls, content = {}, choice.answer
    if calls:
        content = content.strip()
    message = ChatMessage("assistant", content or (None if calls else ""), reasoning_content=reasoning,
                          tool_calls=list(calls.values()))
    return ChatChoice(choice.index, message, choice.finish_reason(end), choice.take_logprobs(), end.stop_reason)
