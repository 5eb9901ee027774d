"""Tokenizers: text <-> ids, chat templates, and incremental detokenization of outputs."""

from rill.tokenizer.detokenizer import Detokenizer
from rill.tokenizer.tokenizer import Tokenizer

__all__ = ["Detokenizer", "Tokenizer"]
