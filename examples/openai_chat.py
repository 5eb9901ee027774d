"""The official `openai` SDK against a running rill server: a question, a streamed answer, and a
tool call answered with the tool's result.

    rill serve                      # rill-tiny on http://127.0.0.1:8000
    python examples/openai_chat.py  # or: RILL_URL=http://host:port/v1 RILL_API_KEY=... python ...
"""

import json
import os

from openai import OpenAI

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def get_weather(city: str) -> dict:
    return {"city": city, "temperature_c": 21, "condition": "sunny"}  # a stand-in for a real service


def main() -> None:
    client = OpenAI(base_url=os.environ.get("RILL_URL", "http://127.0.0.1:8000/v1"),
                    api_key=os.environ.get("RILL_API_KEY", "none"))
    model = client.models.list().data[0].id

    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 347 + 58?"}], temperature=0, max_tokens=64)
    print("> What is 347 + 58?\n" + answer.choices[0].message.content + "\n")

    print("> Reverse the word: stream")
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Reverse the word: stream"}], temperature=0,
        max_tokens=64, stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
        if chunk.usage:
            print(f"\n({chunk.usage.completion_tokens} tokens)\n")

    messages = [{"role": "user", "content": "What's the weather in Tokyo?"}]
    reply = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER], temperature=0,
                                           max_tokens=128).choices[0]
    print(f"> {messages[0]['content']}\nfinish_reason={reply.finish_reason}")
    if not reply.message.tool_calls:
        print(reply.message.content)
        return
    messages.append(reply.message.model_dump(exclude_none=True))
    for call in reply.message.tool_calls:
        print(f"tool call: {call.function.name}({call.function.arguments})")
        result = get_weather(**json.loads(call.function.arguments))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    final = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER], temperature=0,
                                           max_tokens=128)
    print(final.choices[0].message.content)


if __name__ == "__main__":
    main()
