"""Running a Messages request on the chat path: prepare (translate, validate, render), then one
engine run whose deltas ChoiceStream splits and MessageEvents turns into Anthropic's events.
A non-streamed answer runs the same events and returns the message they build."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

from rill.anthropic.events import Event, MessageEvents, new_message_id, stop_reason, usage
from rill.anthropic.schema import CountTokensRequest, MessagesRequest
from rill.anthropic.translate import chat_request, renamed
from rill.errors import ValidationError
from rill.openai.chat import ChatJob, ChoiceStream, load_chat_media, prepare_chat_request
from rill.openai.errors import ApiError, from_exception
from rill.openai.serving import RequestTrace, Serving, decode_body


@dataclass
class MessageJob:
    chat: ChatJob  # the validated chat request that answers it
    stream: bool
    builder: MessageEvents = field(init=False)

    def __post_init__(self) -> None:
        self.builder = MessageEvents(new_message_id(), self.chat.model)


async def prepare_message(serving: Serving, trace: RequestTrace, body: bytes) -> MessageJob:
    """The job answering a Messages body (a 400 naming the Anthropic field when it cannot run). A large
    body is rendered and tokenized in a worker thread (Serving.prepare), as chat's is."""
    job = await serving.prepare(_prepare_message, trace, body)
    await _load_media(serving, job.chat)
    return job


async def count_tokens(serving: Serving, trace: RequestTrace, body: bytes) -> dict[str, int]:
    """POST /v1/messages/count_tokens: the prompt's tokens as the model would read them."""
    job = await serving.prepare(_prepare_count, trace, body)
    await _load_media(serving, job)
    return {"input_tokens": len(job.prompt_ids)}


def _prepare_message(serving: Serving, trace: RequestTrace, body: bytes) -> MessageJob:
    req = decode_body(body, MessagesRequest)
    return MessageJob(_chat_job(serving, trace, req), bool(req.stream))


def _prepare_count(serving: Serving, trace: RequestTrace, body: bytes) -> ChatJob:
    return _chat_job(serving, trace, decode_body(body, CountTokensRequest))


def _chat_job(serving: Serving, trace: RequestTrace, req: CountTokensRequest) -> ChatJob:
    try:
        return prepare_chat_request(serving, trace, chat_request(req, serving.mm_inputs is not None), with_media=True)
    except (ApiError, ValidationError) as exc:  # the grammar compiler raises ValidationError
        raise renamed(from_exception(exc)) from exc


async def _load_media(serving: Serving, job: ChatJob) -> None:
    """The job's images, decoded off the trio thread (a 400 naming the chat message's part: renamed)."""
    try:
        await load_chat_media(serving, job)
    except ApiError as exc:
        raise renamed(exc) from exc


async def message_events(serving: Serving, job: MessageJob) -> AsyncIterator[Event]:
    """The answer's events; message_start waits for the engine's first delta, which knows how many
    prompt tokens the prefix cache supplied."""
    chat, builder = job.chat, job.builder
    choice = ChoiceStream(serving, chat, 0)
    num_prompt = len(chat.prompt_ids)
    started = False
    async with aclosing(serving.run(chat.trace, [chat.prompt_ids], chat.params, chat.mm_items)) as deltas:
        async for _, delta in deltas:
            if delta.error is not None:
                raise ApiError(500, delta.error, code="engine_error")
            events = [] if started else builder.start(num_prompt, delta.num_cached_tokens)
            started = True
            events += builder.feed(choice.on_delta(delta))
            if delta.finished:
                reason, sequence = stop_reason(choice.finish_reason(delta), delta.stop_reason)
                events += builder.finish(reason, sequence,
                                         usage(num_prompt, delta.num_cached_tokens, choice.num_output_tokens))
            for event in events:
                yield event


async def create_message(serving: Serving, job: MessageJob) -> dict:
    """The whole answer, as Anthropic's `message` object."""
    async with aclosing(message_events(serving, job)) as events:
        async for _ in events:
            pass
    return job.builder.message
