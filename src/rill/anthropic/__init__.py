"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) as a thin translation onto
rill's chat serving (rill.openai.chat): one engine path, one tool parser, one reasoning parser.
The wire is transports/anthropic_http.py."""
