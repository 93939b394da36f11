"""Shared by the rehearsal test apps: a seeded sum, asked of the policy and scored."""

from __future__ import annotations

import random
import re


def problem(seed: int) -> tuple[str, int]:
    rng = random.Random(seed)
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    return f"What is {a} + {b}?", a + b


def correct(reply: str, answer: int) -> bool:
    match = re.search(r"Answer:\s*(-?\d+)", reply)
    return bool(match) and int(match.group(1)) == answer
