"""OpenAI's Responses API (POST /v1/responses and its stored responses), on the chat path's engine run.

Not to be confused with `rill.openai.chat_bodies`, the response bodies of Chat Completions.
"""
