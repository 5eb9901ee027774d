"""A model's tokenizer, read from a Hugging Face directory with the `tokenizers` library.

It gives the ids and text that transformers 5's `PreTrainedTokenizerFast.from_pretrained(dir)` gives:
tokenizer.json decides how text becomes ids, its post-processor included (transformers 5 ignores
tokenizer_config.json's add_bos_token/add_eos_token whenever tokenizer.json exists, and so do we);
tokenizer_config.json names the special tokens, may re-flag added tokens, and carries the chat template.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as Backend

from rill.errors import ModelLoadError
from rill.tokenizer.byte_pieces import byte_pieces
from rill.tokenizer.chat_template import ChatTemplates, load_chat_templates, render_chat, select_template
from rill.tokenizer.length_bound import TokenCountBound

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"  # legacy; read only when the config has no added_tokens_decoder

# The named special tokens of transformers' PreTrainedTokenizerBase, in its order.
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_ADDED_TOKEN_FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")

# Texts longer than this are encoded with the GIL released, so that a worker thread tokenizing a
# multi-megabyte prompt does not stop the trio thread (encode_batch's rayon pool costs a little).
LONG_TEXT_CHARS = 16 << 10

Offsets = list[tuple[int, int]]  # per token: the (start, end) characters of the text it came from


class Tokenizer:
    """Encode, decode and render chats for one model. Build it with `Tokenizer.from_dir`.

    Safe to share between threads: nothing changes the backend after loading. (transformers resets padding
    and truncation on every call, which is what makes its fast tokenizers fail with "Already borrowed".)
    """

    def __init__(self, backend: Backend, special_tokens: dict[str, str], extra_special_tokens: list[str],
                 chat_templates: ChatTemplates | None):
        self._backend = backend
        self.special_tokens_map = special_tokens  # name -> text; also template variables (bos_token, ...)
        self.chat_templates = chat_templates
        specials = [*special_tokens.values(), *extra_special_tokens]
        self.all_special_ids = frozenset(i for i in map(backend.token_to_id, specials) if i is not None)
        # Ids the tokenizer knows, added tokens included: transformers' len(tokenizer).
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self.bos_token, self.bos_token_id = self._named("bos_token")
        self.eos_token, self.eos_token_id = self._named("eos_token")
        self.pad_token, self.pad_token_id = self._named("pad_token")
        self.unk_token, self.unk_token_id = self._named("unk_token")
        # Built once here, read by every detokenizer (None: not a plain ByteLevel decoder).
        self._byte_pieces = {skip: byte_pieces(backend, self.vocab_size, skip) for skip in (True, False)}
        self._byte_texts = {skip: _whole_texts(pieces) for skip, pieces in self._byte_pieces.items()}

    @classmethod
    def from_dir(cls, path: str | Path, chat_template: str | None = None) -> Tokenizer:
        """Load from a model directory; `chat_template` (template text) replaces the model's own templates."""
        path = Path(path)
        backend = _load_backend(path / TOKENIZER_FILE)
        config = _read_json(path / CONFIG_FILE)
        named, extra = _special_tokens(path, config)
        _register_added_tokens(backend, config, list(named.values()), extra)
        templates = chat_template if chat_template is not None else load_chat_templates(path, config)
        return cls(backend, {k: t.content for k, t in named.items()}, [t.content for t in extra], templates)

    def _named(self, name: str) -> tuple[str | None, int | None]:
        text = self.special_tokens_map.get(name)
        return text, (None if text is None else self._backend.token_to_id(text))

    # -- text <-> ids ---------------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) > LONG_TEXT_CHARS:  # encode_batch releases the GIL (encode holds it: 22 s for 4 MB)
            return self._backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    @functools.cached_property
    def token_count_bound(self) -> TokenCountBound:
        """A lower bound on a text's tokens without tokenizing it (rill.tokenizer.length_bound)."""
        return TokenCountBound.of(self._backend)

    def encode_with_offsets(self, text: str) -> tuple[list[int], Offsets]:
        """Ids without special tokens, and where in text each came from (rill.tokenizer.incremental cuts there)."""
        encoding = self._backend.encode(text, add_special_tokens=False)
        return encoding.ids, encoding.offsets

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Ids the tokenizer does not know decode to nothing, as in `tokenizers`."""
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def byte_pieces(self, skip_special_tokens: bool = True) -> tuple[bytes, ...] | None:
        """Each id's bytes when decoding is plain ByteLevel (see rill.tokenizer.byte_pieces), else None."""
        return self._byte_pieces[skip_special_tokens]

    def byte_texts(self, skip_special_tokens: bool = True) -> tuple[str | None, ...] | None:
        """With byte_pieces: each id's text where its bytes are whole UTF-8 characters, else None
        (a piece of a character; the detokenizer's UTF-8 decoder joins those)."""
        return self._byte_texts[skip_special_tokens]

    @property
    def added_tokens_decoder(self) -> dict:
        """Id -> tokens' AddedToken for the tokens matched in the raw text before the model's own (as in transformers)."""
        return self._backend.get_added_tokens_decoder()

    def get_vocab(self, with_added_tokens: bool = True) -> dict[str, int]:
        """Token string -> id, as in transformers; without added tokens: the model's own vocabulary."""
        return self._backend.get_vocab(with_added_tokens=with_added_tokens)

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        """Token strings; "" for an id the tokenizer does not know (transformers gives None)."""
        return [self._backend.id_to_token(i) or "" for i in ids]

    # -- chats ----------------------------------------------------------------------------------------------

    def apply_chat_template(self, messages, *, tools=None, documents=None, add_generation_prompt: bool = True,
                            chat_template_kwargs: Mapping[str, Any] | None = None,
                            continue_final_message: bool = False) -> str:
        """The prompt text the model's chat template makes of `messages` (see `render_chat`)."""
        template = select_template(self.chat_templates, has_tools=tools is not None)
        variables = {**self.special_tokens_map, **(chat_template_kwargs or {})}
        return render_chat(
            template, messages, tools=tools, documents=documents, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, variables=variables,
        )

    def encode_chat(self, messages, *, tools=None, documents=None, add_generation_prompt: bool = True,
                    chat_template_kwargs: Mapping[str, Any] | None = None,
                    continue_final_message: bool = False) -> list[int]:
        """Render, then encode without adding special tokens: the template writes its own, as in transformers."""
        text = self.apply_chat_template(
            messages, tools=tools, documents=documents, add_generation_prompt=add_generation_prompt,
            chat_template_kwargs=chat_template_kwargs, continue_final_message=continue_final_message,
        )
        return self.encode(text, add_special_tokens=False)


# -- loading ------------------------------------------------------------------------------------------------


def _load_backend(path: Path) -> Backend:
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing: rill reads tokenizers in the tokenizer.json format")
    try:
        backend = Backend.from_file(str(path))
    except Exception as e:  # the Rust side raises plain Exception for a malformed file
        raise ModelLoadError(f"{path} could not be read: {e}") from e
    # Lengths are the engine's to check: never cut or pad a prompt behind its back.
    backend.no_truncation()
    backend.no_padding()
    return backend


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path} could not be read: {e}") from e
    if not isinstance(value, dict):
        raise ModelLoadError(f"{path} must hold a JSON object")
    return value


def _special_tokens(path: Path, config: dict[str, Any]) -> tuple[dict[str, AddedToken], list[AddedToken]]:
    """The named special tokens (bos_token, ...) and the extra ones, as transformers 5 collects them."""
    config = dict(config)
    if "added_tokens_decoder" not in config:
        config.update(_read_json(path / SPECIAL_TOKENS_MAP_FILE))  # legacy file, over the config as in transformers
    named = {}
    for name, value in config.items():
        # Model-specific names (image_token, ...) count as named too, when given as plain strings.
        if name in SPECIAL_TOKEN_NAMES or (name.endswith("_token") and isinstance(value, str)):
            named[name] = _as_added_token(value, f"{CONFIG_FILE}: {name}")
    extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
    if isinstance(extra, dict):  # a dict names model-specific tokens
        named.update({k: _as_added_token(v, f"{CONFIG_FILE}: {k}") for k, v in extra.items()})
        extra = []
    named = {k: t for k, t in named.items() if t is not None}
    for token in named.values():
        token.special = True
    return named, [_as_added_token(v, f"{CONFIG_FILE}: extra_special_tokens") for v in extra]


def _as_added_token(value: Any, where: str) -> AddedToken | None:
    """A token given as a string or as an AddedToken dict ({"content": ..., "special": ..., ...})."""
    if value is None:
        return None
    if isinstance(value, str):
        return AddedToken(value, special=True, normalized=False)
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return AddedToken(value["content"], **{k: bool(value[k]) for k in _ADDED_TOKEN_FLAGS if k in value})
    raise ModelLoadError(f"{where} must be a string or an object with a 'content' string")


def _declared_added_tokens(backend: Backend, config: dict[str, Any]) -> list[AddedToken]:
    """The config's added_tokens_decoder, or tokenizer.json's added tokens where the config has none."""
    if "added_tokens_decoder" not in config:
        return [token for _, token in sorted(backend.get_added_tokens_decoder().items())]
    decoder = config["added_tokens_decoder"]
    try:
        ordered = sorted(decoder.items(), key=lambda item: int(item[0]))
    except (AttributeError, ValueError) as e:
        raise ModelLoadError(f"{CONFIG_FILE}: added_tokens_decoder must map token ids to tokens") from e
    return [_as_added_token(value, f"{CONFIG_FILE}: added_tokens_decoder[{i}]") for i, value in ordered]


def _register_added_tokens(backend: Backend, config: dict[str, Any], named: list[AddedToken],
                           extra: list[AddedToken]) -> None:
    """Re-add the declared added tokens, the named special ones flagged special, then the special tokens the
    tokenizer lacks (they get the next free ids).

    This is what transformers 5 does on load, so a token's flags, which decide what decode skips, read the
    same here. Extra special tokens already present keep their flags there too.
    """
    declared = _declared_added_tokens(backend, config)
    named_texts = {token.content for token in named}
    for token in declared:
        if token.content in named_texts:
            token.special = True
    known = {t.content for t in backend.get_added_tokens_decoder().values()} | {t.content for t in declared}
    missing = {t.content: t for t in [*named, *extra] if t.content not in known}
    backend.add_tokens([*declared, *missing.values()])
    backend.encode_special_tokens = bool(config.get("split_special_tokens", False))


def _whole_texts(pieces: tuple[bytes, ...] | None) -> tuple[str | None, ...] | None:
    if pieces is None:
        return None
    texts = []
    for piece in pieces:
        try:
            texts.append(piece.decode("utf-8"))
        except UnicodeDecodeError:
            texts.append(None)
    return tuple(texts)
