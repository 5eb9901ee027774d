"""OpenAI-compatible serving, independent of the transport: request and response schemas
(msgspec), their conversion to SamplingParams, tool-call and reasoning parsers, and the
chat / completion handlers that turn an engine's deltas into OpenAI responses or SSE frames.

The HTTP app (rill.transports.http) is one thin user of it.
"""
