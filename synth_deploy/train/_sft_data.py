"""SFT training data: validate JSONL files of chat examples before anything is uploaded.

One example a line::

    {"messages": [{"role": ..., "content": str | list | object | null,
                   "tool_calls"?: [...], "tool_call_id"?: str, "name"?: str}, ...],
     "tools"?: [...], "tool_choice"?: ..., "metadata"?: {...}}

Every line is read; problems are reported by line number (capped), so a user fixes a file in
one pass instead of one upload per mistake. Tools: see `_sft_tools`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synth_deploy.errors import UsageError
from synth_deploy.train._sft_tools import tool_call_problems, tools_problems

ROLES = ("system", "user", "assistant", "tool", "developer", "function")


@dataclass(frozen=True)
class SFTError:
    """One problem in an SFT file: 1-based ``line`` and what is wrong there."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass
class SFTValidation:
    """Result of validating a whole file: ``count`` valid examples, ``errors`` (capped)."""

    path: Path
    count: int = 0
    lines: int = 0
    errors: list[SFTError] = field(default_factory=list)
    error_count: int = 0  # all problems seen, including those past the cap

    @property
    def ok(self) -> bool:
        return self.error_count == 0 and self.count > 0

    def raise_for_errors(self) -> None:
        """Raise a UsageError listing every kept problem as ``path:line: message``."""
        if self.ok:
            return
        if self.error_count == 0:
            raise UsageError(
                f"{self.path}: no training examples found",
                hint="Add one JSON object with a 'messages' list per line.",
            )
        shown = "\n".join(f"  {self.path}:{e.line}: {e.message}" for e in self.errors)
        more = self.error_count - len(self.errors)
        tail = f"\n  ... and {more} more" if more > 0 else ""
        raise UsageError(
            f"{self.path}: {self.error_count} problem(s) in the SFT data:\n"
            f"{shown}{tail}",
            hint="Fix the lines listed; each must be one JSON object with a 'messages' list.",
        )


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), type(value).__name__
    )


def _validate_message(i: int, msg: Any) -> list[str]:
    where = f"messages[{i}]"
    if not isinstance(msg, dict):
        return [f"{where}: expected an object, got {_type_name(msg)}"]
    problems = _role_problems(where, msg.get("role"))
    if "content" not in msg and "tool_calls" not in msg:
        problems.append(f"{where}.content: required (string, array, object or null)")
    content = msg.get("content")
    if content is not None and not isinstance(content, (str, list, dict)):
        problems.append(
            f"{where}.content: expected string, array, object or null, got {_type_name(content)}"
        )
    if "tool_calls" in msg:
        problems.extend(tool_call_problems(where, msg["tool_calls"]))
    for key in ("tool_call_id", "name"):
        if key in msg and not isinstance(msg[key], str):
            problems.append(f"{where}.{key}: expected a string, got {_type_name(msg[key])}")
    return problems


def _role_problems(where: str, role: Any) -> list[str]:
    """A message's role: present, and one the trainer knows."""
    if role is None:
        return [f"{where}.role: required"]
    if not isinstance(role, str) or role not in ROLES:
        return [f"{where}.role: expected one of {', '.join(ROLES)}, got {role!r}"]
    return []


def validate_sft_example(obj: Any) -> list[str]:
    """Problems with one decoded example, each prefixed by its field path; [] when valid."""
    if not isinstance(obj, dict):
        return [f"expected a JSON object, got {_type_name(obj)}"]
    # Extra keys (e.g. a message's "weight") are left for the backend: providers add fields.
    problems = _messages_problems(obj.get("messages"))
    problems.extend(tools_problems(obj.get("tools")))
    if "metadata" in obj and obj["metadata"] is not None and not isinstance(obj["metadata"], dict):
        problems.append(f"metadata: expected an object, got {_type_name(obj['metadata'])}")
    return problems


def _messages_problems(messages: Any) -> list[str]:
    """The ``messages`` list: present, not empty, each message valid, one of them a reply."""
    if messages is None:
        return ["messages: required (a non-empty array of messages)"]
    if not isinstance(messages, list):
        return [f"messages: expected an array, got {_type_name(messages)}"]
    if not messages:
        return ["messages: must hold at least one message"]
    problems: list[str] = []
    for i, msg in enumerate(messages):
        problems.extend(_validate_message(i, msg))
    if not any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages):
        # Training learns the assistant's turns: without one the example teaches nothing.
        problems.append("messages: no assistant message (the reply to learn); add "
                        '{"role": "assistant", "content": ...}')
    return problems


def validate_sft_file(path: str | os.PathLike[str], *, max_errors: int = 50) -> SFTValidation:
    """Read every line of a JSONL file; empty lines are skipped, bad ones reported by number.

    Raises UsageError only when the file cannot be read at all.
    """
    p = Path(path)
    result = SFTValidation(path=p)
    try:
        handle = p.open("r", encoding="utf-8")
    except OSError as exc:
        raise UsageError(
            f"{p}: cannot read SFT data ({exc.strerror or exc})",
            hint="Check the path in [job].data or --dataset.",
        ) from exc

    def add(line: int, message: str) -> None:
        result.error_count += 1
        if len(result.errors) < max_errors:
            result.errors.append(SFTError(line, message))

    with handle:
        lineno = 0
        while True:
            try:
                raw = handle.readline()
            except UnicodeDecodeError as exc:
                add(lineno + 1, f"not UTF-8 text ({exc.reason})")
                break
            if not raw:
                break
            lineno += 1
            result.lines = lineno
            if not raw.strip():
                continue
            try:
                # Without its line break: a line cut short is an error at its end, not at
                # "column 1" of the next line.
                obj = json.loads(raw.rstrip("\r\n"))
            except json.JSONDecodeError as exc:
                add(lineno, f"invalid JSON: {exc.msg} (column {exc.colno})")
                continue
            problems = validate_sft_example(obj)
            if problems:
                for problem in problems:
                    add(lineno, problem)
            else:
                result.count += 1
    return result


__all__ = [
    "SFTError",
    "SFTValidation",
    "validate_sft_example",
    "validate_sft_file",
]
