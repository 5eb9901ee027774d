"""Grammar compilation on the request path, with a cache keyed by the grammar's text.

Compiling builds llguidance's parser for a grammar over the model's vocabulary (well under a
millisecond for the JSON schemas clients send, up to about a second for huge grammars; llguidance
drops the GIL meanwhile). It happens before a request reaches the engine, so a new schema never
stalls the engine's step; the engine only copies the cached matcher for each sequence.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection

import llguidance

from rill.errors import ValidationError
from rill.structured.specs import GrammarSpec
from rill.structured.vocab import ll_tokenizer, special_tags

DEFAULT_CACHE_SIZE = 256


class Grammar:
    """A compiled grammar: a matcher in its start state, which each constrained sequence copies."""

    def __init__(self, spec: GrammarSpec, start: llguidance.LLMatcher):
        self.spec = spec
        self._start = start  # never advanced: only copied

    def new_matcher(self) -> llguidance.LLMatcher:
        """A fresh matcher for one sequence (a copy shares the compiled grammar and lexer)."""
        return self._start.deep_copy()

    def __repr__(self) -> str:
        return f"Grammar({self.spec.kind})"


class GrammarCompiler:
    """Compiles specs for one model's vocabulary; safe to call from several threads."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: Collection[int],
                 cache_size: int = DEFAULT_CACHE_SIZE):
        self.vocab_size = vocab_size
        self.cache_size = cache_size
        self._tokenizer = ll_tokenizer(tokenizer, vocab_size, eos_token_ids)
        self.special_tags = special_tags(tokenizer)  # tokens a grammar names (specs.tool_call's tags)
        self._cache: OrderedDict[str, Grammar] = OrderedDict()
        self._lock = threading.Lock()
        self.num_compiled = 0  # cache misses, for tests and metrics

    def compile(self, spec: GrammarSpec, param: str) -> Grammar:
        """The grammar for spec, from the cache or compiled now; ValidationError naming param if invalid."""
        with self._lock:
            grammar = self._cache.get(spec.text)
            if grammar is not None:
                self._cache.move_to_end(spec.text)
                return grammar
        grammar = Grammar(spec, self._matcher(spec, param))
        with self._lock:
            self.num_compiled += 1
            self._cache[spec.text] = grammar
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return grammar

    def _matcher(self, spec: GrammarSpec, param: str) -> llguidance.LLMatcher:
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(spec.text, self._tokenizer)
        if is_error:
            raise ValidationError(f"{param} cannot be enforced: {_first_line(messages)}", param=param)
        matcher = llguidance.LLMatcher(self._tokenizer, spec.text, log_level=0)
        if matcher.is_error():
            raise ValidationError(f"{param} cannot be enforced: {_first_line([matcher.get_error()])}", param=param)
        return matcher


def _first_line(messages: list[str]) -> str:
    """llguidance's message, without the grammar listing it appends to some."""
    text = messages[0] if messages else "invalid grammar"
    return text.split("\n<state>")[0].split("\n<grammar>")[0].strip()
