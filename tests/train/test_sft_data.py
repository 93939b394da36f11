"""SFT JSONL validation: every line read, problems reported by line number, capped."""

from __future__ import annotations

import json

import pytest

from synth_deploy.errors import UsageError
from synth_deploy.train import upload_copy, validate_sft_example, validate_sft_file

GOOD = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}


def write(tmp_path, lines, name="data.jsonl"):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_valid_examples_of_every_shape_pass():
    assert validate_sft_example(GOOD) == []
    rich = {
        "messages": [
            {"role": "system", "content": None, "name": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": "add", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": {"result": 4}},
        ],
        "tools": [{"type": "function", "function": {"name": "add"}}],
        "tool_choice": "auto",
        "metadata": {"seed": 1},
    }
    assert validate_sft_example(rich) == []


@pytest.mark.parametrize("example, expected", [
    ([], "expected a JSON object, got array"),
    ({}, "messages: required"),
    ({"messages": []}, "messages: must hold at least one message"),
    ({"messages": "hi"}, "messages: expected an array, got string"),
    ({"messages": [{"content": "x"}]}, "messages[0].role: required"),
    ({"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role: expected one of"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content: expected string"),
    ({"messages": [{"role": "user"}]}, "messages[0].content: required"),
    ({"messages": [GOOD["messages"][0], {"role": "assistant", "tool_calls": {}}]},
     "messages[1].tool_calls: expected an array"),
    ({"messages": [{"role": "tool", "content": "4", "tool_call_id": 7}]},
     "messages[0].tool_call_id: expected a string, got int"),
    ({"messages": [GOOD["messages"][0]], "tools": "add"}, "tools: expected an array"),
    ({"messages": [GOOD["messages"][0]], "metadata": [1]}, "metadata: expected an object"),
])
def test_each_problem_names_its_field(example, expected):
    problems = validate_sft_example(example)
    assert any(p.startswith(expected) for p in problems), problems


def test_file_reports_every_bad_line_by_number_and_skips_blank_lines(tmp_path):
    path = write(tmp_path, [json.dumps(GOOD), "", "{not json", json.dumps({"messages": []}),
                            "   ", json.dumps(GOOD), json.dumps([1])])
    result = validate_sft_file(path)
    assert not result.ok
    assert result.count == 2
    assert [e.line for e in result.errors] == [3, 4, 7]
    assert "invalid JSON" in result.errors[0].message
    with pytest.raises(UsageError) as info:
        result.raise_for_errors()
    assert f"{path}:3: invalid JSON" in info.value.message
    assert f"{path}:7: expected a JSON object" in info.value.message


def test_errors_are_capped_but_counted(tmp_path):
    path = write(tmp_path, ["{bad"] * 120)
    result = validate_sft_file(path, max_errors=10)
    assert len(result.errors) == 10 and result.error_count == 120
    with pytest.raises(UsageError, match="and 110 more"):
        result.raise_for_errors()


def test_valid_file_is_ok_and_empty_file_is_not(tmp_path):
    ok = validate_sft_file(write(tmp_path, [json.dumps(GOOD)] * 3))
    assert ok.ok and ok.count == 3 and ok.errors == []
    ok.raise_for_errors()
    empty = validate_sft_file(write(tmp_path, ["", ""], "empty.jsonl"))
    assert not empty.ok
    with pytest.raises(UsageError, match="no training examples"):
        empty.raise_for_errors()


def test_missing_file_and_non_utf8_are_clear(tmp_path):
    with pytest.raises(UsageError, match="cannot read SFT data"):
        validate_sft_file(tmp_path / "nope.jsonl")
    path = tmp_path / "latin.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n\xff\xfe\n")
    result = validate_sft_file(path)
    assert result.errors and "UTF-8" in result.errors[0].message


def test_upload_copy_keeps_first_n_examples_and_leaves_the_original(tmp_path):
    lines = [json.dumps({**GOOD, "metadata": {"i": i}}) for i in range(5)]
    path = write(tmp_path, [lines[0], "", *lines[1:]])
    before = path.read_bytes()
    assert upload_copy(path) is None  # nothing to change: the file goes as it is
    copy = upload_copy(path, examples=3)
    try:
        kept = [json.loads(x)["metadata"]["i"] for x in copy.read_text().splitlines()]
        assert kept == [0, 1, 2]
        assert path.read_bytes() == before
    finally:
        copy.unlink()
    with pytest.raises(UsageError):
        upload_copy(path, examples=0)
