"""semantic_vad's question to the chat model: how likely is it that the user's turn ends after these
words? (rill.speech.semantic_vad)

The answer is the model's probability of its chat template's end-of-user-turn token (the first
token of what the template writes after a user message: `<|im_end|>` in ChatML, `</s>` or
`[/INST]` elsewhere) right after the conversation so far and the user's words. It is computed on
the engine worker as a one-token request over the same prompt the turn's anchor session holds:
the sampler is made to pick that token (logit_bias) and reports its logprob from the raw logits
(`logprobs=0`), so the figure is the model's own distribution, untouched by the bias. A one-token
request rather than prompt logprobs: prompt logprobs score every prompt token where one is wanted
(a [prompt, vocab] log-softmax), the full KV blocks this request has in common with the anchor can
come from the prefix cache, and streaming sessions refuse prompt logprobs anyway.
"""

from __future__ import annotations

import logging
import math

from rill.errors import RillError
from rill.sampling_params import SamplingParams
from rill.transports.realtime.events import RealtimeError
from rill.transports.realtime.text_input import split_prompt

log = logging.getLogger(__name__)
FORCE_BIAS = 100.0  # OpenAI's largest logit_bias: the end-of-turn token is the one sampled


class TurnEndScorer:
    """`await scorer(text)` -> P(end of turn | conversation, text), or None when it cannot be asked."""

    def __init__(self, conn):
        self.conn = conn  # the RealtimeConnection whose user is speaking
        self.num_requests = 0

    def prompt(self, text: str) -> tuple[list[int], int] | None:
        """The anchor's prompt with `text` as the user's words so far, and the end-of-turn token (None
        for a template that writes nothing after a user message). Pictures and video in the
        conversation are left out: the question is about the words, and the text is enough to ask it."""
        conn = self.conn
        tokenizer, settings = conn.serving.tokenizer, conn.settings
        messages = conn.conversation.messages(settings.instructions)
        split = split_prompt(tokenizer, messages, settings.template_tools)
        tail = tokenizer.encode(split.suffix, add_special_tokens=False)
        if not tail:
            return None
        return tokenizer.encode(split.prefix + text, add_special_tokens=False), tail[0]

    async def __call__(self, text: str) -> float | None:
        try:
            prompt = self.prompt(text)
            if prompt is None or len(prompt[0]) + 1 > self.conn.serving.max_model_len:
                return None
            ids, end_of_turn = prompt
            params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=0, logit_bias={end_of_turn: FORCE_BIAS})
            self.num_requests += 1
            async for delta in self.conn.serving.engine.generate(ids, params):
                if delta.logprobs:
                    return math.exp(delta.logprobs[0].logprob)
                if delta.error is not None:
                    break
        except (RillError, RealtimeError, ValueError) as exc:  # no answer: the cap ends the turn
            log.warning("semantic_vad: the end-of-turn probability failed: %s", exc)
        return None
