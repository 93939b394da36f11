"""Tools in SFT examples, as synth-ai's SFT reader takes them (``sdk/learning/sft/data.py``).

synth-ai reads a tool definition flat, ``{"name", "description"?, "parameters"?}``, and
refuses OpenAI's nested form ``{"type": "function", "function": {...}}`` ("tool 0 missing
name"). A tool call it takes nested (``{"function": {"name", "arguments"}}``) or flat
(``{"name", "arguments"}``). We accept both tool forms, check them by synth-ai's rules, and
send the flat one: `synth_deploy.tracing.flat_tools` turns a list into it (the SFT export
writes it), and `upload_copy` rewrites a file that holds nested tools before it is uploaded.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from synth_deploy.errors import UsageError

TOOL_FORMS = ('{"name", "description"?, "parameters"?} or OpenAI\'s '
              '{"type": "function", "function": {...}}')


def tools_problems(tools: Any) -> list[str]:
    """Problems with an example's ``tools``, by synth-ai's rules (either form accepted)."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        return [f"tools: expected an array, got {_kind(tools)}"]
    problems = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            problems.append(f"tools[{i}]: expected an object ({TOOL_FORMS}), got {_kind(tool)}")
            continue
        problems += _tool_problems(i, tool)
    return problems


def _tool_problems(i: int, tool: dict[str, Any]) -> list[str]:
    """One tool definition's problems, named at the path the user wrote it under."""
    from synth_deploy.tracing import flat_tools  # the SFT example's owner

    flat, at = flat_tools([tool])[0], f"tools[{i}]" + (".function" if "name" not in tool
                                               and "function" in tool else "")
    problems = []
    name = flat.get("name")
    if not isinstance(name, str) or not name.strip():
        problems.append(f"{at}.name: required (a tool is {TOOL_FORMS})")
    if flat.get("description") is not None and not isinstance(flat["description"], str):
        problems.append(f"{at}.description: expected a string, got "
                        f"{_kind(flat['description'])}")
    if flat.get("parameters") is not None and not isinstance(flat["parameters"], dict):
        problems.append(f"{at}.parameters: expected an object (a JSON schema), got "
                        f"{_kind(flat['parameters'])}")
    return problems


def tool_call_problems(where: str, calls: Any) -> list[str]:
    """Problems with a message's ``tool_calls``: each names its function, nested or flat."""
    if not isinstance(calls, list):
        return [f"{where}.tool_calls: expected an array, got {_kind(calls)}"]
    problems = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        if not isinstance(call, dict):
            problems.append(f"{at}: expected an object, got {_kind(call)}")
            continue
        fn = call.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            name = call.get("name")
        if not isinstance(name, str) or not name.strip():
            problems.append(f"{at}.function.name: required string is missing")
    return problems


def upload_copy(path: str | os.PathLike[str], *, examples: int | None = None) -> Path | None:
    """A temporary copy of ``path`` to upload instead, or None when the file goes as it is.

    The copy holds the first ``examples`` examples (when given) with their tools flattened.
    The caller owns the copy and deletes it; the original is never touched.
    """
    if examples is not None and examples < 1:
        raise UsageError(f"--examples must be at least 1, got {examples}")
    src = Path(path)
    fd, name = tempfile.mkstemp(prefix=f"{src.stem}.upload.", suffix=".jsonl")
    changed, kept = examples is not None, 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out, \
                src.open("r", encoding="utf-8") as inp:
            for raw in inp:
                if not raw.strip():
                    continue
                line, flattened = _flattened(raw)
                changed = changed or flattened
                out.write(line)
                kept += 1
                if examples is not None and kept >= examples:
                    break
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    if not changed:
        Path(name).unlink(missing_ok=True)
        return None
    return Path(name)


def _flattened(raw: str) -> tuple[str, bool]:
    """One JSONL line as it is uploaded (newline-ended, tools flat); True when it changed."""
    from synth_deploy.tracing import flat_tools  # the SFT example's owner

    line = raw if raw.endswith("\n") else raw + "\n"
    if '"function"' not in raw:  # only lines that may hold nested tools are parsed
        return line, False
    example = json.loads(raw)
    tools = example.get("tools") if isinstance(example, dict) else None
    if flat_tools(tools) == tools:
        return line, False
    example["tools"] = flat_tools(tools)
    return json.dumps(example, ensure_ascii=False) + "\n", True


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), type(value).__name__)


__all__ = ["tool_call_problems", "tools_problems", "upload_copy"]
