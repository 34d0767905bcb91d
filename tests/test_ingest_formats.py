"""Source shapes -> chat prompts: every supported format, the last-user-turn rule, ids, errors."""

from __future__ import annotations

import json

import pytest

from dflashx.data.formats import FormatError, detect_format, sample_id, to_prompt


def test_messages_keep_system_and_context_but_drop_final_answer():
    record = {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+2?"}]},
        {"role": "assistant", "content": "4"},
    ]}
    prompt = to_prompt(record, "messages")
    assert prompt == {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "What is 2+2?"},
    ]}


def test_sharegpt_roles_are_mapped():
    record = {"conversations": [
        {"from": "system", "value": "S"}, {"from": "human", "value": "q1"}, {"from": "gpt", "value": "a1"},
        {"from": "human", "value": "q2"}, {"from": "gpt", "value": "a2"},
    ]}
    roles = [m["role"] for m in to_prompt(record, "sharegpt")["messages"]]
    assert roles == ["system", "user", "assistant", "user"]


def test_alpaca_joins_input_and_uses_field_mapping():
    plain = to_prompt({"instruction": "Translate", "input": "bonjour", "output": "hello"}, "alpaca")
    assert plain["messages"] == [{"role": "user", "content": "Translate\n\nbonjour"}]
    orca = to_prompt(
        {"system_prompt": "You are an AI.", "question": "Why is the sky blue?", "response": "Rayleigh."},
        "alpaca", fields={"system": "system_prompt", "prompt": "question"},
    )
    assert orca["messages"] == [
        {"role": "system", "content": "You are an AI."},
        {"role": "user", "content": "Why is the sky blue?"},
    ]


def test_plain_prompt_gets_source_system_prompt_only_when_missing():
    added = to_prompt({"prompt": "Tell a joke"}, "prompt", system_prompt="Be funny.")
    assert added["messages"][0] == {"role": "system", "content": "Be funny."}
    kept = to_prompt({"messages": [{"role": "system", "content": "Own"}, {"role": "user", "content": "x"}]},
                     system_prompt="Be funny.")
    assert [m["content"] for m in kept["messages"]] == ["Own", "x"]


def test_function_calling_keeps_tools_from_openai_and_sharegpt_shapes():
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    openai = to_prompt({"messages": [{"role": "user", "content": "Weather?"}], "tools": [tool]}, "function_calling")
    assert openai["tools"] == [tool]
    sharegpt = to_prompt(
        {"conversations": [{"from": "human", "value": "Weather?"}], "tools": json.dumps([tool["function"]])},
        "function_calling",
    )
    assert sharegpt["tools"] == [tool]


def test_glaive_function_calling_parses_tools_and_turns():
    record = {
        "system": "SYSTEM: You are a helpful assistant with access to the following functions. Use them if required -\n"
                  '{\n  "name": "convert_currency",\n  "parameters": {"type": "object"}\n}\n\n{"name": "get_news"}',
        "chat": "USER: Convert 10 USD ASSISTANT: <functioncall> {\"name\": \"convert_currency\"} <|endoftext|> "
                "FUNCTION RESPONSE: {\"amount\": 9} ASSISTANT: It is 9 EUR. <|endoftext|> USER: Thanks! "
                "ASSISTANT: You're welcome. <|endoftext|>",
    }
    prompt = to_prompt(record, "auto")
    assert [t["function"]["name"] for t in prompt["tools"]] == ["convert_currency", "get_news"]
    assert [m["role"] for m in prompt["messages"]] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert prompt["messages"][0]["content"].startswith("You are a helpful assistant with access")
    assert prompt["messages"][-1]["content"] == "Thanks!"
    assert all("<|endoftext|>" not in m["content"] for m in prompt["messages"])


@pytest.mark.parametrize("record, fmt", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "assistant", "content": "only an answer"}]}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
    ({"conversations": [{"from": "alien", "value": "x"}]}, "sharegpt"),
    ({"instruction": "   "}, "alpaca"),
    ({"question": "q"}, "alpaca"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": "{not json"}, "function_calling"),
    (["not", "an", "object"], "auto"),
    ({"text": "no known keys"}, "auto"),
])
def test_malformed_records_raise_format_error(record, fmt):
    with pytest.raises(FormatError):
        to_prompt(record, fmt)


def test_error_message_names_the_fix():
    with pytest.raises(FormatError, match=r"fields: \{prompt: <key>\}"):
        to_prompt({"question": "q"}, "alpaca")


def test_detect_format():
    assert detect_format({"messages": []}) == "messages"
    assert detect_format({"conversations": []}) == "sharegpt"
    assert detect_format({"instruction": "x"}) == "alpaca"
    assert detect_format({"prompt": "x"}) == "prompt"
    assert detect_format({"messages": [], "tools": []}) == "function_calling"


def test_sample_id_is_a_stable_content_hash():
    a = to_prompt({"instruction": "Say hi"}, "alpaca")
    b = to_prompt({"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]})
    c = to_prompt({"instruction": "Say hi!"}, "alpaca")
    assert sample_id(a) == sample_id(b)  # same normalised prompt from two shapes
    assert sample_id(a) != sample_id(c)
    assert sample_id(a) == sample_id(json.loads(json.dumps(a)))
    assert len(sample_id(a)) == 20
