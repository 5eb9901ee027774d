"""Where streamed input goes in a chat or completion request, and the request bodies that carry it.

Chat: the streamed text extends the content of the request's last message when that message
is a user message; otherwise a user message holding only the streamed text is appended. The
prompt is the chat template rendered over those messages (with the generation prompt), exactly
as if the request had been sent whole with that content. To find where the text goes, the
messages are rendered with a sentinel at the end of that content: the text before it is the
prompt's prefix (prefilled as the session opens), the text after it (`<|im_end|>\\n<|im_start|>
assistant\\n` for ChatML) is appended at end of input.

Completions: the streamed text extends `prompt` (a string, or token ids; the text after ids is
tokenized on its own).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgspec

from rill.errors import TemplateRewritesTextError
from rill.openai import sse
from rill.openai.chat import ChatJob, chat_job, complete_chat, message_dict, render_prompt, stream_chat
from rill.openai.completions import CompletionJob, check_completion, complete, prompt_token_ids, stream_completion
from rill.openai.errors import bad_request
from rill.openai.requests import ChatCompletionRequest, CompletionRequest, Message
from rill.openai.chat_bodies import ChatChunkChoice, ChatCompletionChunk, ChatDelta, Completion, CompletionChoice
from rill.openai.serving import RequestTrace, Serving
from rill.openai.streaming_speech import AudioOutput
from rill.outputs import RequestDelta
from rill.sessions.chunks import InputChunk
from rill.sessions.config import SessionOptions
from rill.tokenizer.chat_template import STREAMED_TEXT_PLACEHOLDER, split_at_placeholder

# respond_per_chunk: an answer and the next user text, to find what the template writes between them.
ANSWER_PLACEHOLDER = "\ue000rill:answer\ue000"
NEXT_TURN_PLACEHOLDER = "\ue000rill:next-turn\ue000"


class StreamingChatRequest(ChatCompletionRequest, kw_only=True):
    """Mode A's first line, Mode B's create body: a chat request whose last user text streams in."""

    messages: list[Message] = []
    streaming_input: SessionOptions | None = None
    chunk: InputChunk | None = None  # Mode B: an optional first chunk
    modalities: list[str] | None = None  # ["text", "audio"]: the answer is spoken too (streaming_speech.py)
    audio: AudioOutput | None = None


class StreamingCompletionRequest(CompletionRequest, kw_only=True):
    prompt: str | list[int] = ""
    streaming_input: SessionOptions | None = None
    chunk: InputChunk | None = None
    modalities: list[str] | None = None
    audio: AudioOutput | None = None


class StreamingOptionsOnly(msgspec.Struct):
    """Enough of a Mode B create body to learn which API it speaks."""

    streaming_input: SessionOptions | None = None


@dataclass
class PromptParts:
    """The prompt around the streamed text."""

    prefix_text: str  # before the streamed text, tokenized with it
    prefix_ids: list[int]  # before that: a completion prompt given as token ids
    suffix_text: str  # appended at end of input
    add_special_tokens: bool  # a completion prompt gets the tokenizer's BOS, as when sent whole
    turn_text: str = ""  # respond_per_chunk: what goes between an answer and the next chunk


class ChatApi:
    name = "chat"
    endpoint = "/v1/chat/completions"
    trace_prefix = "chatcmpl"
    prompt_param = "messages"
    request_type = StreamingChatRequest
    stream = staticmethod(stream_chat)
    complete = staticmethod(complete_chat)

    @staticmethod
    def prepare(serving: Serving, trace: RequestTrace, req: StreamingChatRequest) -> tuple[ChatJob, PromptParts]:
        if req.continue_final_message:
            raise bad_request("continue_final_message does not combine with streaming input: the streamed text "
                              "extends the last user message", "continue_final_message", "unsupported")
        job = chat_job(serving, trace, req)
        check_one_choice(job.params.n)
        rendered = render_prompt(serving, job, _with_user_text(job, STREAMED_TEXT_PLACEHOLDER))
        prefix, suffix = _split(rendered, STREAMED_TEXT_PLACEHOLDER)
        return job, PromptParts(prefix, [], suffix, False)

    @staticmethod
    def turn_text(serving: Serving, job: ChatJob) -> str:
        """respond_per_chunk: what the template writes from the end of an answer to the next user text."""
        rendered = render_prompt(serving, job, [*_with_user_text(job, ""), *_next_turn()])
        return _split(_split(rendered, ANSWER_PLACEHOLDER)[1], NEXT_TURN_PLACEHOLDER)[0]

    @staticmethod
    def set_prompt(job: ChatJob, ids: list[int], text: str) -> None:
        job.prompt_ids = ids
        job.trace.num_prompt_tokens = len(ids)

    @staticmethod
    def turn_frame(job: ChatJob, delta: RequestDelta) -> bytes:
        choice = TurnEndChatChoice(delta.index, ChatDelta(), turn_finish_reason=delta.turn_finish_reason)
        return sse.data_frame(ChatCompletionChunk(job.trace.request_id, job.created, job.model, [choice]))


class CompletionApi:
    name = "completions"
    endpoint = "/v1/completions"
    trace_prefix = "cmpl"
    prompt_param = "prompt"
    request_type = StreamingCompletionRequest
    stream = staticmethod(stream_completion)
    complete = staticmethod(complete)

    @staticmethod
    def prepare(serving: Serving, trace: RequestTrace, req: StreamingCompletionRequest,
                ) -> tuple[CompletionJob, PromptParts]:
        model, params = check_completion(serving, req)
        check_one_choice(params.n)
        if params.prompt_logprobs is not None:
            raise bad_request("echo with logprobs scores the whole prompt: streamed input does not support it",
                              "logprobs", "unsupported")
        job = CompletionJob(req, trace, model, [[]], [], params, int(time.time()))
        if isinstance(req.prompt, list):
            ids = prompt_token_ids(serving, req.prompt)[0] if req.prompt else []
            return job, PromptParts("", ids, "", False)
        return job, PromptParts(req.prompt, [], "", True)

    @staticmethod
    def turn_text(serving: Serving, job: CompletionJob) -> str:
        return ""  # respond_per_chunk: each chunk simply continues the text

    @staticmethod
    def set_prompt(job: CompletionJob, ids: list[int], text: str) -> None:
        job.prompts = [ids]
        job.trace.num_prompt_tokens = len(ids)
        if job.request.echo:
            job.prompt_texts = [text]

    @staticmethod
    def turn_frame(job: CompletionJob, delta: RequestDelta) -> bytes:
        choice = TurnEndCompletionChoice(delta.index, "", turn_finish_reason=delta.turn_finish_reason)
        return sse.data_frame(Completion(job.trace.request_id, job.created, job.model, [choice]))


APIS = {api.name: api for api in (ChatApi, CompletionApi)}


# respond_per_chunk: a chunk's answer ended on its own. rill's extension of the chunk format;
# OpenAI clients read it as an empty delta.
class TurnEndChatChoice(ChatChunkChoice):
    turn_finish_reason: str | None = None


class TurnEndCompletionChoice(CompletionChoice):
    turn_finish_reason: str | None = None


def check_one_choice(n: int) -> None:
    if n != 1:
        raise bad_request("streaming input supports n=1 only", "n")


def _with_user_text(job: ChatJob, text: str) -> list[dict[str, Any]]:
    """The chat rule: text ends the last message if it is the user's, else is a new user message."""
    messages = [message_dict(m, i) for i, m in enumerate(job.request.messages)]
    if messages and messages[-1]["role"] == "user":
        return [*messages[:-1], {**messages[-1], "content": (messages[-1]["content"] or "") + text}]
    return [*messages, {"role": "user", "content": text}]


def _next_turn() -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": ANSWER_PLACEHOLDER}, {"role": "user", "content": NEXT_TURN_PLACEHOLDER}]


def _split(rendered: str, placeholder: str) -> tuple[str, str]:
    try:
        return split_at_placeholder(rendered, placeholder)
    except TemplateRewritesTextError as exc:
        raise bad_request("this model's chat template does not place the last user message's text verbatim in "
                          "the prompt, so it cannot be streamed in", "messages", "unsupported") from exc
