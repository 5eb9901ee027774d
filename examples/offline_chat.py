"""Offline use of rill: ask rill-tiny (the model inside the package) a few questions, then
let it call a tool and use the tool's result.

    python examples/offline_chat.py
"""

import json

from rill import LLM, SamplingParams

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def main() -> None:
    llm = LLM("rill-tiny")
    params = SamplingParams(temperature=0, max_tokens=256)
    questions = ["What is 347 + 58?", "Reverse the word: stream", "Uppercase: hello world",
                 'How many letters are in "banana"?', "What is rill?"]
    for question, out in zip(questions, llm.chat([[{"role": "user", "content": q}] for q in questions], params)):
        print(f"> {question}\n{out.outputs[0].text}\n")

    messages = [{"role": "user", "content": "What's the weather in Tokyo?"}]
    call_text = llm.chat(messages, params, tools=[WEATHER])[0].outputs[0].text
    print(f"> {messages[0]['content']}\n{call_text}\n")
    call = json.loads(call_text.split("<tool_call>")[1].split("</tool_call>")[0])
    messages += [
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]},
        {"role": "tool", "content": json.dumps({"temperature_c": 21, "condition": "sunny"})},
    ]
    print(llm.chat(messages, params, tools=[WEATHER])[0].outputs[0].text)


if __name__ == "__main__":
    main()
