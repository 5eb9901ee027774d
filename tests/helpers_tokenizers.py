"""Small tokenizers of the two shapes rill's models use, trained here (no hub), saved as HF directories.

- ByteLevel BPE (GPT-2, Llama 3, Qwen): every byte is a token, so a character can span several ids.
  rill-tiny's variant isolates every letter, digit and newline first (`letter_digit_bpe`).
- Byte-fallback BPE with a `▁` metaspace (Llama 2, Mistral): characters missing from the vocabulary
  become `<0xE4>`-style byte tokens, and the first word of a string loses its leading space on decode.
  `sentencepiece_bpe` writes the `▁` with a normalizer, as transformers converts Llama 2 and Mistral.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from rill.tiny.tokenizer_train import train_tokenizer

CORPUS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "What is 17 + 25? The answer is 42. Let me think step by step.",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))",
    "The weather in Paris is sunny today; tomorrow it will rain.",
    "call the get_weather tool with the city name and the unit",
    "你好，世界！今天天气很好。我们去公园散步吧。",
    "日本語のテキストも少し入れておきます。こんにちは。",
    "Emoji: 😀 🎉 👍🏽 🇫🇷 and café, naïve, Straße, Ελληνικά, русский.",
]

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen marks these as added but not special: they survive skip_special_tokens.
QWEN_PLAIN_ADDED = ["<tool_call>", "</tool_call>", "<think>", "</think>"]
LLAMA_SPECIALS = ["<unk>", "<s>", "</s>"]


@lru_cache
def _byte_level_json(vocab_size: int) -> str:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=QWEN_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    tok.add_tokens(QWEN_PLAIN_ADDED)
    return tok.to_str()


def byte_level_bpe(vocab_size: int = 420) -> Tokenizer:
    """A Qwen-shaped ByteLevel BPE with <|im_start|>/<|im_end|> specials and <think>-style added tokens."""
    return Tokenizer.from_str(_byte_level_json(vocab_size))


def letter_digit_bpe() -> Tokenizer:
    """rill-tiny's recipe (every letter, digit and newline its own pre-token), trained on CORPUS."""
    return train_tokenizer(CORPUS * 4, vocab_size=300)


@lru_cache
def _byte_fallback_json(vocab_size: int, words: bool = False) -> str:
    """words: sentencepiece's training (pieces never span words) and its `▁` written by a normalizer."""
    # limit_alphabet alone breaks ties between equally frequent characters in hash order, so the kept
    # alphabet (and which characters fall back to bytes) changed from run to run: name the 60 here.
    counts = Counter("".join(CORPUS).replace(" ", "▁"))
    alphabet = [c for c, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:60]]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=LLAMA_SPECIALS, limit_alphabet=60,
                                  initial_alphabet=alphabet)
    draft = Tokenizer(models.BPE(unk_token="<unk>"))
    draft.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=words)
    if words:
        draft.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split("\n", behavior="isolated"),
                                                       draft.pre_tokenizer])
    draft.train_from_iterator(CORPUS * 4, trainer)
    trained = json.loads(draft.to_str())["model"]
    # sentencepiece puts the 256 byte tokens right after the specials; shift the learned pieces past them.
    pieces = sorted(trained["vocab"].items(), key=lambda kv: kv[1])[len(LLAMA_SPECIALS):]
    vocab = {t: i for i, t in enumerate(LLAMA_SPECIALS + [f"<0x{b:02X}>" for b in range(256)])}
    vocab.update({t: len(vocab) + n for n, (t, _) in enumerate(pieces)})
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if words:  # no pre-tokenizer: BPE runs over the whole text
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens(LLAMA_SPECIALS)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    return tok.to_str()


def byte_fallback_bpe(vocab_size: int = 400) -> Tokenizer:
    """A Llama-2-shaped byte-fallback BPE: `▁` metaspace, <0xNN> byte tokens, BOS added by the post-processor."""
    return Tokenizer.from_str(_byte_fallback_json(vocab_size))


def sentencepiece_bpe(vocab_size: int = 400) -> Tokenizer:
    """Llama 2 / Mistral as transformers converts them: a normalizer prepends `▁` and writes spaces as `▁`,
    no pre-tokenizer; like sentencepiece's, the learned pieces never span two words."""
    return Tokenizer.from_str(_byte_fallback_json(vocab_size, words=True))


def qwen_config(**overrides) -> dict:
    return {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
            "model_max_length": 32768, **overrides}


def llama_config(**overrides) -> dict:
    return {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True, **overrides}


def save_dir(path: Path, backend: Tokenizer, config: dict | None = None, *, chat_template: str | None = None) -> Path:
    """Write an HF tokenizer directory: tokenizer.json, tokenizer_config.json, optional chat_template.jinja."""
    path.mkdir(parents=True, exist_ok=True)
    backend.save(str(path / "tokenizer.json"))
    if config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    if chat_template is not None:
        (path / "chat_template.jinja").write_text(chat_template, encoding="utf-8")
    return path


def hf_tokenizer(path: Path):
    """transformers' view of the same directory: the oracle."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(path))


# Strings that exercise merges, byte fallback, multi-byte characters and special-token text.
SAMPLE_TEXTS = [
    "",
    "Hello world!",
    " leading space and  double  spaces ",
    "你好，世界！天气",
    "Emoji 😀🎉👍🏽🇫🇷 mixed with text",
    "unseen chars: ☃ ∑ 𝔘 ß",
    "<|im_start|>user\nhi<|im_end|>\n<think>hmm</think>",
    "<s> a bos in text </s>",
    "line one\nline two\n\n\ttabbed",
]
