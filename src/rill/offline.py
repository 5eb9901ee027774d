"""The offline API: `LLM(model).generate(...)` and `.chat(...)`, driving EngineCore in the
caller's thread until every request is done."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from rill.config import EngineConfig
from rill.engine.core import EngineCore
from rill.media import MediaPolicy
from rill.multimodal.offline import chat_messages, prompt_items
from rill.outputs import CompletionOutput, RequestOutput
from rill.sampling_params import SamplingParams

Prompt = str | list[int] | dict  # dict: {"prompt" or "prompt_token_ids", "multi_modal_data"} (vLLM's)


class LLM:
    """Offline batched generation, e.g. `LLM("rill-tiny").generate(["What is 2 + 2?"])`."""

    def __init__(self, model: str = "rill-tiny", **engine_kwargs):
        self.engine = EngineCore(EngineConfig(model=str(model), **engine_kwargs))
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def close(self) -> None:
        """Stop the engine's other processes (tensor_parallel_size > 1); nothing to do otherwise."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def default_sampling_params(self) -> SamplingParams:
        return SamplingParams.from_generation_config(self.engine.generation_config)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        texts = [p if isinstance(p, str) else p.get("prompt") if isinstance(p, dict) else None for p in prompts]
        ids = [self._prompt_ids(p) for p in prompts]
        mm = [prompt_items(self.engine, i, p.get("multi_modal_data") if isinstance(p, dict) else None)
              for i, p in zip(ids, prompts)]
        return self._run([m[0] for m in mm], texts, params, [m[1] for m in mm])

    def _prompt_ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, dict):
            return list(prompt["prompt_token_ids"]) if "prompt_token_ids" in prompt else self.tokenizer.encode(
                prompt["prompt"])
        return prompt if not isinstance(prompt, str) else self.tokenizer.encode(prompt)

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        tools: list[dict] | None = None,
        chat_template_kwargs: dict | None = None,
        add_generation_prompt: bool = True,
        media_policy: MediaPolicy | None = None,
    ) -> list[RequestOutput]:
        """One conversation (a list of messages) or a list of conversations. Content parts may be
        image_url / video_url (data: URLs, or what media_policy allows) and image_pil for a vision model."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        rendered = [chat_messages(self.engine, conv, media_policy or MediaPolicy()) for conv in conversations]
        texts = [
            self.tokenizer.apply_chat_template(
                conv, tools=tools, add_generation_prompt=add_generation_prompt,
                chat_template_kwargs=chat_template_kwargs,
            )
            for conv, _ in rendered
        ]
        mm = [prompt_items(self.engine, self.tokenizer.encode(t, add_special_tokens=False), data)
              for t, (_, data) in zip(texts, rendered)]
        return self._run([m[0] for m in mm], texts, params, [m[1] for m in mm])

    def _run(self, ids: list[list[int]], texts: list[str | None], params, mm_items=None) -> list[RequestOutput]:
        if params is None:
            params = self.default_sampling_params()
        all_params = list(params) if isinstance(params, Sequence) else [params] * len(ids)
        if len(all_params) != len(ids):
            raise ValueError(f"got {len(all_params)} sampling params for {len(ids)} prompts")
        results: dict[str, RequestOutput] = {}
        try:
            for prompt_ids, text, p, items in zip(ids, texts, all_params, mm_items or [()] * len(ids)):
                request_id = f"offline-{next(self._ids)}"
                self.engine.add_request(request_id, prompt_ids, p, items)
                outputs = [CompletionOutput(index=i) for i in range(p.n)]
                results[request_id] = RequestOutput(request_id, text, prompt_ids, outputs)
            self._drain(results)
        finally:
            for request_id in results:
                self.engine.abort(request_id)  # no-op for finished requests; frees KV on error
        return list(results.values())

    def _drain(self, results: dict[str, RequestOutput]) -> None:
        while not all(r.finished for r in results.values()):
            if not self.engine.has_work:
                raise RuntimeError("engine has no work left but requests are unfinished")
            for delta in self.engine.step():
                out = results[delta.request_id]
                out.outputs[delta.index].add(delta)
                out.num_cached_tokens = max(out.num_cached_tokens, delta.num_cached_tokens)
