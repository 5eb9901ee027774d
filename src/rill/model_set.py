"""Which models `rill serve` serves, under which names, each with which engine settings.

    rill serve                          every model the package ships that this build has: rill-tiny,
                                        plus rill-tiny-vision when its directory exists
    rill serve DIR                      one model, named DIR (as before; vLLM names it the same way)
    rill serve --model A --model B      several; the first is the default for requests naming none
    --model NAME=DIR                    served as NAME (llama.cpp router-style presets); otherwise the
                                        argument as given is the name, as for one model

`--served-model-name` names the first model (the default) as it names the only one. Engine flags
apply to every model; the KV budget in bytes (--kv-cache-gb, or its default) is the server's,
split evenly between the models, while --num-kv-blocks (whose bytes depend on each model's shape)
is per model. --chat-template, a file for one model's tokens, applies to the first model only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rill.config import EngineConfig, default_kv_cache_bytes
from rill.errors import RillError

RILL_TINY = "rill-tiny"


@dataclass(frozen=True)
class ModelSpec:
    """One --model argument: the model (rill-tiny, rill-tiny-vision or a directory), its served name."""

    model: str
    name: str

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """NAME=DIR, or DIR (named DIR). A `=` inside a path (a NAME with a slash) is part of the path."""
        name, sep, model = text.partition("=")
        if sep and name and model and "/" not in name:
            return cls(model, name)
        return cls(text, text)


@dataclass
class ServedModel:
    names: list[str]  # served names; the first is what /v1/models and responses call it
    config: EngineConfig


def shipped_models() -> list[ModelSpec]:
    """`rill serve` with no model: rill-tiny, and rill-tiny-vision when this build has it."""
    from rill.assets import RILL_TINY_VISION, tiny_vision_dir

    specs = [ModelSpec(RILL_TINY, RILL_TINY)]
    if tiny_vision_dir().is_dir():
        specs.append(ModelSpec(RILL_TINY_VISION, RILL_TINY_VISION))
    return specs


def model_specs(positional: str | None, flags: list[str] | None, env_model: str | None) -> list[ModelSpec]:
    """The models asked for: the positional MODEL then each --model; with neither, RILL_MODEL; with
    none of them, the shipped models."""
    given = ([positional] if positional else []) + list(flags or [])
    if not given and env_model:
        given = [env_model]
    return [ModelSpec.parse(text) for text in given] if given else shipped_models()


def served_models(base: EngineConfig, specs: list[ModelSpec], served_model_names: list[str] | None = None,
                  ) -> list[ServedModel]:
    """One ServedModel per spec: its names, and `base` with its model and its share of the KV budget."""
    if len(specs) > 1 and base.tensor_parallel_size > 1:
        raise RillError("--tensor-parallel-size above 1 serves one model; run one rill serve per model")
    served = []
    for i, spec in enumerate(specs):
        names = list(served_model_names) if i == 0 and served_model_names else [spec.name]
        served.append(ServedModel(names, _model_config(base, spec, i, len(specs))))
    _check_unique([name for model in served for name in model.names])
    return served


def _model_config(base: EngineConfig, spec: ModelSpec, index: int, num_models: int) -> EngineConfig:
    config = replace(base, model=spec.model, chat_template=base.chat_template if index == 0 else None)
    if num_models > 1 and base.num_kv_blocks is None:
        config.kv_cache_bytes = (base.kv_cache_bytes or default_kv_cache_bytes()) // num_models
    return config


def _check_unique(names: list[str]) -> None:
    seen = set()
    for name in names:
        if name in seen:
            raise RillError(f"two models are served as {name!r}: name them apart with --model NAME=DIR")
        seen.add(name)
