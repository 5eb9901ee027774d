"""Chat templates render exactly as transformers' apply_chat_template renders them, and fail cleanly.

The templates below have the shape of real ones (Qwen2.5, Qwen3, Llama 3.1, Mistral v0.1); each case renders
the same messages through rill and through transformers' PreTrainedTokenizerFast loaded from the same
directory, and compares the text and the ids.
"""

from __future__ import annotations

import datetime
import json

import pytest
from helpers_tokenizers import byte_fallback_bpe, byte_level_bpe, hf_tokenizer, llama_config, qwen_config, save_dir

from rill.errors import ChatTemplateError, ValidationError
from rill.tokenizer import Tokenizer

QWEN25_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

QWEN3_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""

LLAMA3_TEMPLATE = """{{- bos_token }}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools_in_user_message and not tools is none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
    {%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

MISTRAL_TEMPLATE = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""

# Content given as a list of parts; the template walks them, as multimodal templates do.
PARTS_TEMPLATE = """{%- for message in messages %}
<|im_start|>{{ message.role }}
{% if message.content is string %}{{ message.content }}{% else %}{% for part in message.content %}
{% if part.type == 'text' %}{{ part.text }}{% elif part.type == 'image_url' %}<image>{% endif %}
{% endfor %}{% endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# Documents for retrieval, tojson's options and a `{% generation %}` block, as Command-R-style templates use.
DOCUMENTS_TEMPLATE = """{%- if documents %}<docs>
{% for doc in documents %}[{{ loop.index }}] {{ doc.title }}: {{ doc.text }}
{% endfor %}</docs>
{% endif %}
{%- for message in messages %}{{ message.role }}: {% if message.role == 'assistant' %}{% generation %}{{ message.content }}{% endgeneration %}{% else %}{{ message.content }}{% endif %}
{% if message.meta is defined %}{{ message.meta | tojson(indent=2, sort_keys=true) }}
{{ message.meta | tojson(separators=(',', ':')) }}
{% endif %}{% endfor %}
{%- if add_generation_prompt %}assistant:{% endif %}"""

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris or 東京"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
BARE_TOOL = {
    "name": "add",
    "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
}

SIMPLE = [{"role": "user", "content": "What is 17 + 25?"}]
MULTI_TURN = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi! Quel temps fait-il à Paris? 你好 😀"},
    {"role": "assistant", "content": "Sunny, 21°C."},
    {"role": "user", "content": "And tomorrow?"},
]


def _tool_conversation(arguments) -> list[dict]:
    return [
        {"role": "user", "content": "What's the weather in Paris?"},
        {
            "role": "assistant",
            "content": None,  # OpenAI clients send null content with tool calls
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "sky": "clear"}'},
    ]


TOOL_DICT_ARGS = _tool_conversation({"city": "Paris", "unit": "celsius"})
TOOL_STRING_ARGS = _tool_conversation('{"city": "Paris", "unit": "celsius"}')
THINKING_HISTORY = [
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4", "reasoning_content": "Two plus two is four."},
    {"role": "user", "content": "3+3?"},
    {"role": "assistant", "content": "<think>\nadd\n</think>\n\n6"},
]


def _pair(tmp_path_factory, template: str, shape: str):
    """rill's and transformers' tokenizers for one directory holding `template`."""
    backend, config = (byte_level_bpe(), qwen_config()) if shape == "qwen" else (byte_fallback_bpe(), llama_config())
    path = save_dir(tmp_path_factory.mktemp(shape), backend, config, chat_template=template)
    return Tokenizer.from_dir(path), hf_tokenizer(path)


TEMPLATES = {
    "qwen25": (QWEN25_TEMPLATE, "qwen"),
    "qwen3": (QWEN3_TEMPLATE, "qwen"),
    "llama3": (LLAMA3_TEMPLATE, "llama"),
    "mistral": (MISTRAL_TEMPLATE, "llama"),
    "parts": (PARTS_TEMPLATE, "qwen"),
    "documents": (DOCUMENTS_TEMPLATE, "qwen"),
}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    return {name: _pair(tmp_path_factory, *spec) for name, spec in TEMPLATES.items()}


def _assert_same(pair, messages, **kwargs):
    ours, hf = pair
    extra = kwargs.pop("chat_template_kwargs", None) or {}
    kwargs.setdefault("add_generation_prompt", True)  # rill's default; transformers' is False
    hf_text = hf.apply_chat_template(messages, tokenize=False, **kwargs, **extra)
    assert ours.apply_chat_template(messages, chat_template_kwargs=extra, **kwargs) == hf_text
    hf_ids = hf.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs, **extra)
    assert ours.encode_chat(messages, chat_template_kwargs=extra, **kwargs) == hf_ids
    return hf_text


CASES = [
    ("qwen25", SIMPLE, {}),
    ("qwen25", MULTI_TURN, {"add_generation_prompt": False}),
    ("qwen25", SIMPLE, {"tools": [WEATHER_TOOL, BARE_TOOL]}),
    ("qwen25", TOOL_DICT_ARGS, {"tools": [WEATHER_TOOL]}),
    ("qwen25", TOOL_STRING_ARGS, {"tools": [WEATHER_TOOL]}),
    ("qwen3", MULTI_TURN, {}),
    ("qwen3", SIMPLE, {"chat_template_kwargs": {"enable_thinking": False}}),
    ("qwen3", SIMPLE, {"chat_template_kwargs": {"enable_thinking": True}}),
    ("qwen3", THINKING_HISTORY, {"add_generation_prompt": False}),
    ("qwen3", TOOL_DICT_ARGS, {"tools": [WEATHER_TOOL]}),
    ("qwen3", TOOL_STRING_ARGS, {"tools": [WEATHER_TOOL]}),
    ("llama3", MULTI_TURN, {}),
    ("llama3", TOOL_DICT_ARGS, {"tools": [WEATHER_TOOL]}),
    ("llama3", SIMPLE, {"chat_template_kwargs": {"date_string": "01 Jan 2030"}}),
    ("mistral", MULTI_TURN, {"add_generation_prompt": False}),
    ("mistral", MULTI_TURN[1:3], {"continue_final_message": True, "add_generation_prompt": False}),
    ("qwen25", MULTI_TURN[:3], {"continue_final_message": True, "add_generation_prompt": False}),
]


@pytest.mark.parametrize(("name", "messages", "kwargs"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_renders_and_encodes_like_transformers(pairs, name, messages, kwargs):
    _assert_same(pairs[name], messages, **kwargs)


def test_tool_call_arguments_pass_to_the_template_unchanged(pairs):
    as_dict = _assert_same(pairs["qwen3"], TOOL_DICT_ARGS, tools=[WEATHER_TOOL])
    as_string = _assert_same(pairs["qwen3"], TOOL_STRING_ARGS, tools=[WEATHER_TOOL])
    assert '"arguments": {"city": "Paris", "unit": "celsius"}}' in as_dict
    assert as_dict == as_string  # this template prints a string as-is and dumps a dict


def test_tools_are_dumped_with_non_ascii_kept(pairs):
    text = _assert_same(pairs["qwen25"], SIMPLE, tools=[WEATHER_TOOL])
    assert json.dumps(WEATHER_TOOL, ensure_ascii=False) in text
    assert "東京" in text


def test_llama_template_writes_bos_once_in_the_ids(pairs):
    ours, _ = pairs["llama3"]
    ids = ours.encode_chat(SIMPLE)
    assert ids[0] == ours.bos_token_id
    assert ids.count(ours.bos_token_id) == 1


def test_enable_thinking_false_closes_an_empty_think_block(pairs):
    ours, _ = pairs["qwen3"]
    off = ours.apply_chat_template(SIMPLE, chat_template_kwargs={"enable_thinking": False})
    on = ours.apply_chat_template(SIMPLE)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert on.endswith("<|im_start|>assistant\n")


def test_content_parts_reach_the_template_as_a_list(pairs):
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "Describe"}, {"type": "image_url", "image_url": {"url": "x"}}]},
        {"role": "assistant", "content": "A cat."},
    ]
    text = _assert_same(pairs["parts"], parts)
    assert "Describe<image>" in text


def test_string_only_template_given_content_parts_fails_cleanly_as_in_transformers(pairs):
    ours, hf = pairs["qwen25"]  # it concatenates message.content to strings
    parts = [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    with pytest.raises(TypeError):
        hf.apply_chat_template(parts, tokenize=False)
    with pytest.raises(ChatTemplateError, match="TypeError: can only concatenate str"):
        ours.apply_chat_template(parts)


def test_documents_tojson_options_and_generation_blocks_render_like_transformers(pairs):
    messages = [
        {"role": "user", "content": "Summarise", "meta": {"b": 1, "a": ["é", 2]}},
        {"role": "assistant", "content": "Done."},
    ]
    documents = [{"title": "Doc A", "text": "Alpha"}, {"title": "Doc B", "text": "Beta ünïcode"}]
    text = _assert_same(pairs["documents"], messages, documents=documents)
    assert "[2] Doc B: Beta ünïcode" in text
    assert '{"b":1,"a":["é",2]}' in text


def test_reasoning_under_an_older_name_reaches_reasoning_content(pairs):
    history = [{"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "6", "reasoning": "Add."}]
    text = _assert_same(pairs["qwen3"], history, add_generation_prompt=False)
    assert "<think>\nAdd.\n</think>\n\n6" in text


def test_mistral_role_alternation_error_is_a_chat_template_error(pairs):
    ours, _ = pairs["mistral"]
    with pytest.raises(ChatTemplateError) as info:
        ours.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert str(info.value) == (
        "After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."
    )
    assert info.value.param == "messages"


def test_template_raise_exception_in_tool_path_names_the_problem(pairs):
    ours, _ = pairs["llama3"]
    two_calls = [dict(m) for m in TOOL_DICT_ARGS]
    two_calls[1] = {**two_calls[1], "tool_calls": two_calls[1]["tool_calls"] * 2}
    with pytest.raises(ChatTemplateError, match="only supports single tool-calls"):
        ours.apply_chat_template(two_calls, tools=[WEATHER_TOOL])


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{% for m in messages %}{{ m.content }", "syntax error on line 1"),
        ("{{ messages[0].content.nope() }}", "the chat template failed"),
        ("{{ messages[0].__class__ }}{{ ''.__class__.__mro__ }}", "is unsafe"),
        ("{{ 1 + 'a' }}", "TypeError"),
        ("{% set ns = namespace() %}{% set ns._x = 1 %}", "namespace attribute '_x'"),
    ],
)
def test_broken_or_unsafe_templates_raise_chat_template_error(tmp_path, template, expected):
    ours = Tokenizer.from_dir(save_dir(tmp_path, byte_level_bpe(), qwen_config()), chat_template=template)
    with pytest.raises(ChatTemplateError, match=expected):
        ours.apply_chat_template(SIMPLE)


def test_a_model_without_a_template_says_how_to_give_one(tmp_path):
    ours = Tokenizer.from_dir(save_dir(tmp_path, byte_level_bpe(), qwen_config()))
    with pytest.raises(ChatTemplateError, match="--chat-template"):
        ours.apply_chat_template(SIMPLE)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
        ({"continue_final_message": True, "add_generation_prompt": True}, "continue_final_message"),
        ({"tools": [{"type": "function"}, "not a dict"]}, "tools"),
        ({"documents": "a string"}, "documents"),
    ],
)
def test_invalid_arguments_are_validation_errors_naming_the_param(pairs, kwargs, param):
    ours, _ = pairs["qwen25"]
    with pytest.raises(ValidationError) as info:
        ours.apply_chat_template(SIMPLE, **kwargs)
    assert info.value.param == param


@pytest.mark.parametrize("messages", [[], "hello", [{"role": "user", "content": "a"}, "b"]])
def test_malformed_messages_are_validation_errors(pairs, messages):
    ours, _ = pairs["qwen25"]
    with pytest.raises(ValidationError) as info:
        ours.apply_chat_template(messages)
    assert info.value.param == "messages"


def test_continue_final_message_needs_content_to_continue(pairs):
    ours, _ = pairs["qwen25"]
    with pytest.raises(ValidationError, match="content"):
        ours.apply_chat_template(TOOL_DICT_ARGS[:2], continue_final_message=True, add_generation_prompt=False)


def test_strftime_now_formats_the_current_time(tmp_path):
    ours = Tokenizer.from_dir(save_dir(tmp_path, byte_level_bpe(), qwen_config()),
                              chat_template="{{ strftime_now('%Y-%m') }}")
    before = datetime.datetime.now().strftime("%Y-%m")
    rendered = ours.apply_chat_template(SIMPLE)
    assert rendered in {before, datetime.datetime.now().strftime("%Y-%m")}


def test_special_tokens_are_variables_that_chat_template_kwargs_override(tmp_path):
    template = "{{ bos_token }}|{{ eos_token }}|{{ unk_token }}|{{ pad_token is defined }}"
    path = save_dir(tmp_path, byte_fallback_bpe(), llama_config(), chat_template=template)
    ours, hf = Tokenizer.from_dir(path), hf_tokenizer(path)
    text = hf.apply_chat_template(SIMPLE, tokenize=False)
    assert text == "<s>|</s>|<unk>|False"
    assert ours.apply_chat_template(SIMPLE) == text
    assert ours.apply_chat_template(SIMPLE, chat_template_kwargs={"bos_token": "B"}).startswith("B|")
