"""rill-tiny's tokenizer: byte-level BPE where every letter, digit and newline is its own token.

The pre-tokenizer isolates each letter, digit and "\\n" before ByteLevel maps bytes to symbols,
so BPE merges form only inside runs of spaces and punctuation (`": "`, `"}}`, ...). Reversal,
uppercasing, counting and column arithmetic then work on single characters, and a prompt that
ends in "assistant\\n" never shares a token with the answer that follows. Any UTF-8 text is
encodable (byte fallback through ByteLevel's 256-symbol alphabet).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from rill.tiny.template import CHAT_TEMPLATE, TOOLS_HEADER

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # ids 0, 1, 2
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<tools>", "</tools>")
# The template's fixed preamble before the tools list is one token too (it is 145 letters and marks
# otherwise): the tools list then starts right after the system prompt.
PROMPT_TOKENS = (TOOLS_HEADER,)
# The fixed JSON around tool schemas, calls and results, one token each (ordinary added tokens, as
# the tool markers): a schema costs a handful of tokens instead of ~100, so a prompt listing several
# tools keeps the tool names inside the sliding window, and a call is name, keys and values only.
# Added tokens match leftmost-longest: the long fragments cover the shapes frameworks emit (hand
# order; pydantic's sorted keys with titles; the Agents SDK's strict tail; Jinja's fully sorted
# tojson), and the short key tokens after them cover any other order.
JSON_TOKENS = (
    '{"type": "function", "function": {"name": "', '", "description": "',
    '", "parameters": {"type": "object", "properties": {"', '": {"type": "string"}', '}, "required": ["', '"]}}}',
    '{"function": {"description": "', '", "name": "', '", "parameters": {"properties": {"',
    '"], "type": "object"}}, "type": "function"}',
    '{"name": "', '", "arguments": {"', '": "', '"}}',
    '{"temperature_c": ', ', "condition": "', '"}', '{"time": "', '", "timezone": "',
    # pydantic order, titles, descriptions, enums, no required, the Agents SDK's strict tail
    '": {"title": "', '", "type": "string"}', '": {"description": "', '", "title": "', '": {"type": "string", "description": "',
    '": {"default": "', '", "enum": ["', '": {"type": "string", "enum": ["', '", "',
    '"], "type": "object"}}}', '}, "type": "object"}}}', '"], "title": "',
    '", "type": "object", "additionalProperties": false}, "strict": true}}', '"], "additionalProperties": false}, "strict": true}}',
    '", "description": null, "parameters": {', ', "strict": true', '"additionalProperties": false',
    ': str) -> str\\n', 'Correctly extracted `', '` with all the required parameters with correct types',
    '"type": "string"', '"type": "object"', '"properties": {"', '"required": ["', '"title": "', '"description": "', '"enum": ["',
)
DEFAULT_VOCAB_SIZE = 512
# Every layer attends over a sliding window, so positions past the 1024-token training rows stay
# in distribution: the model is usable for long streaming sessions (tested at 20,000 tokens).
MODEL_MAX_LENGTH = 32768


def train_tokenizer(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[\p{L}\p{N}\n]"), behavior="isolated"),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    # Tool markers are ordinary added tokens (kept when decoding with skip_special_tokens), as in Qwen.
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in (*TOOL_TOKENS, *PROMPT_TOKENS, *JSON_TOKENS)])
    return tokenizer


def tokenizer_config() -> dict:
    """tokenizer_config.json: the chat template and the special tokens, with no BOS added."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": ENDOFTEXT,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "chat_template": CHAT_TEMPLATE,
    }


def save_tokenizer(tokenizer: Tokenizer, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2, ensure_ascii=False) + "\n")


def special_ids(tokenizer: Tokenizer) -> dict[str, int]:
    return {t: tokenizer.token_to_id(t) for t in (*SPECIAL_TOKENS, *TOOL_TOKENS)}
