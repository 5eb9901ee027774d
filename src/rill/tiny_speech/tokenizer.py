"""rill-tiny-speech's tokenizer: a small byte-level BPE over the transcripts, in Whisper's layout.

Ordinary tokens come first, then Whisper's special tokens in OpenAI's English-only order (one
language token, <|en|>, right after <|startoftranscript|>: WhisperTokenizer finds a language at
sot + 1 + its index). <|notimestamps|> is the last id, so "every id above it is a timestamp", as
transformers' Whisper code reads it, is true of no id. Digits are split one by one, and the
vocabulary is small, so held-out numbers and words are spelled from pieces seen in training.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

ENDOFTEXT = "<|endoftext|>"
STARTOFTRANSCRIPT = "<|startoftranscript|>"
EN = "<|en|>"
TRANSLATE = "<|translate|>"
TRANSCRIBE = "<|transcribe|>"
STARTOFLM = "<|startoflm|>"
STARTOFPREV = "<|startofprev|>"
NOSPEECH = "<|nocaptions|>"
NOTIMESTAMPS = "<|notimestamps|>"
SPECIAL_TOKENS = (ENDOFTEXT, STARTOFTRANSCRIPT, EN, TRANSLATE, TRANSCRIBE, STARTOFLM, STARTOFPREV, NOSPEECH, NOTIMESTAMPS)
DEFAULT_VOCAB_SIZE = 400  # ordinary tokens: the 256 bytes and 144 merges
MODEL_MAX_LENGTH = 96


def train_tokenizer(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
    """Texts as the model sees them, with Whisper's leading space (" What is 347 + 58?")."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tokenizer


def special_ids(tokenizer: Tokenizer) -> dict[str, int]:
    return {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}


def tokenizer_config() -> dict:
    """tokenizer_config.json for WhisperTokenizer(Fast): English-only, no timestamps predicted."""
    return {
        "tokenizer_class": "WhisperTokenizer",
        "bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT, "pad_token": ENDOFTEXT, "unk_token": ENDOFTEXT,
        "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
        "add_prefix_space": False, "errors": "replace", "clean_up_tokenization_spaces": False,
        "language": None, "task": None, "predict_timestamps": False,
        "model_max_length": MODEL_MAX_LENGTH,
    }


def save_tokenizer(tokenizer: Tokenizer, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
