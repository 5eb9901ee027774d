"""Tokenizers: text <-> ids, chat templates, incremental encoding of streamed text and incremental
detokenization of outputs."""

from rill.tokenizer.detokenizer import Detokenizer
from rill.tokenizer.incremental import IncrementalEncoder
from rill.tokenizer.tokenizer import Tokenizer

__all__ = ["Detokenizer", "IncrementalEncoder", "Tokenizer"]
