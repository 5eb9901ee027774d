"""Structured outputs: constrained decoding on llguidance (https://github.com/guidance-ai/llguidance).

A request's constraint is a `GrammarSpec` (rill.structured.specs: JSON schema, any JSON object,
regex, choice, Lark or GBNF grammar, a tool call). `GrammarCompiler` turns it into a `Grammar` on
the request path, checked and cached by its text, so the engine only ever gets ready grammars;
each sequence copies the grammar's matcher, the sampler fills the batch's token bitmasks in one
call (rill.structured.bitmask) and the engine advances the matcher per committed token.
"""

from rill.structured.compiler import Grammar, GrammarCompiler
from rill.structured.specs import GrammarSpec

__all__ = ["Grammar", "GrammarCompiler", "GrammarSpec"]
