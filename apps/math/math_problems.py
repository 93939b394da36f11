"""Seeded arithmetic word problems in three difficulty tiers, and answer parsing.

A seed fully determines its problem, so a trainer, an evaluator and a judge agree on it.
Seeds 0–8999 form the train split, 9000–9999 the test split; seed % 3 picks the tier.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

TIERS = ("easy", "medium", "hard")
TRAIN_SEEDS = range(0, 9000)
TEST_SEEDS = range(9000, 10000)

_WORD_PROBLEMS = (
    ("A baker makes {a} trays of {b} muffins and sells {c} of them. "
     "How many muffins are left?", lambda a, b, c: a * b - c),
    ("A library has {a} shelves with {b} books each. It receives {c} more books. "
     "How many books does it have now?", lambda a, b, c: a * b + c),
    ("Maya saves {b} dollars a week for {a} weeks, then spends {c} dollars on a bike. "
     "How many dollars does she have left?", lambda a, b, c: a * b - c),
    ("A train carries {a} cars of {b} passengers; at the first stop {c} passengers get off. "
     "How many passengers remain?", lambda a, b, c: a * b - c),
    ("A farmer plants {a} rows of {b} tomato plants and {c} extra plants by the fence. "
     "How many plants are there in all?", lambda a, b, c: a * b + c),
)


@dataclass(frozen=True)
class Problem:
    seed: int
    difficulty: str
    split: str
    question: str
    answer: int
    template: str


def split_of(seed: int) -> str:
    if seed in TRAIN_SEEDS:
        return "train"
    if seed in TEST_SEEDS:
        return "test"
    raise LookupError(f"seed {seed} is outside 0-9999 (train 0-8999, test 9000-9999)")


def make_problem(seed: int) -> Problem:
    split = split_of(seed)
    rng = random.Random(f"math-v1:{seed}")
    difficulty = TIERS[seed % 3]
    if difficulty == "easy":
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        op = rng.choice("+-")
        answer = a + b if op == "+" else a - b
        return Problem(seed, difficulty, split, f"What is {a} {op} {b}?", answer, "binary")
    if difficulty == "medium":
        a, b, c = rng.randint(2, 15), rng.randint(2, 15), rng.randint(1, 60)
        op = rng.choice("+-")
        answer = a * b + c if op == "+" else a * b - c
        return Problem(seed, difficulty, split, f"Compute {a} * {b} {op} {c}.", answer,
                       "precedence")
    index = rng.randrange(len(_WORD_PROBLEMS))
    text, solve = _WORD_PROBLEMS[index]
    a, b = rng.randint(3, 12), rng.randint(4, 25)
    c = rng.randint(1, a * b - 1)
    return Problem(seed, difficulty, split, text.format(a=a, b=b, c=c), solve(a, b, c),
                   f"word-{index}")


_ANSWER_TAG = re.compile(r"answer\s*[:=]\s*\**\s*(-?\d[\d,]*)", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\{\s*(-?\d[\d,]*)\s*\}")
_INTEGER = re.compile(r"-?\d[\d,]*")


@dataclass(frozen=True)
class ParsedAnswer:
    value: int | None
    well_formatted: bool  # the answer was tagged ("Answer: N" or \\boxed{N}), not guessed


def parse_answer(text: str) -> ParsedAnswer:
    for pattern in (_ANSWER_TAG, _BOXED):
        matches = pattern.findall(text or "")
        if matches:
            return ParsedAnswer(int(matches[-1].replace(",", "")), True)
    numbers = _INTEGER.findall(text or "")
    if numbers:
        return ParsedAnswer(int(numbers[-1].replace(",", "")), False)
    return ParsedAnswer(None, False)
