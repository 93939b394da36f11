"""The ranges a config's numbers are expected in, said as warnings where synth-ai admits more.

synth-ai 0.4.4's config models (``sdk/api/train/configs/``) declare their numbers as plain
``int``/``float``: a ``batch_size = 0`` or a ``training.weight_sync.verify_every_k = 0`` loads
and is built into the job payload as written, and the backend decides. So do ours: a value
outside its expected range (`Expected`, in the field's ``Annotated`` metadata, which pydantic
leaves alone) loads, and `range_warnings` says which, where and why. Only where synth-ai's own
builder refuses a value (the SFT hyperparameters, `prepare_sft_job_payload`) is the range a
pydantic bound, and an error.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, get_args, get_origin

from pydantic import BaseModel


@dataclass(frozen=True)
class Expected:
    """The range a trainer is expected to take a number in (``what``: its kind, said in the
    warning). Not enforced: see the module docstring."""

    what: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None

    def problem(self, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        if self.ge is not None and value < self.ge:
            return self._said("at least", self.ge, value)
        if self.gt is not None and value <= self.gt:
            return self._said("greater than", self.gt, value)
        if self.le is not None and value > self.le:
            return self._said("at most", self.le, value)
        return None

    def _said(self, words: str, bound: float, value: Any) -> str:
        shown = bound if isinstance(bound, int) or not bound.is_integer() else int(bound)
        return f"expected {words} {shown} ({self.what}), got {value!r}"


# Ranges a trainer can take: a count is at least 1 and fits the 32-bit integer a backend
# stores it in; a rate is positive; a probability is between 0 and 1. (A float is finite
# everywhere: `read_toml` refuses inf and nan in any value, which JSON cannot carry.)
_MOST = 2**31 - 1
Count = Annotated[int, Expected("a count", ge=1, le=_MOST)]
Index = Annotated[int, Expected("a seed or index", ge=0, le=_MOST)]
Every = Annotated[int, Expected("an interval; 0: never", ge=0, le=_MOST)]
TopK = Annotated[int, Expected("-1: off, else a count", ge=-1, le=_MOST)]  # vLLM's top_k
Port = Annotated[int, Expected("a port; 0: any free one", ge=0, le=65535)]
Positive = Annotated[float, Expected("a positive number", gt=0)]
NonNegative = Annotated[float, Expected("a number, not negative", ge=0)]
Probability = Annotated[float, Expected("a probability", ge=0, le=1)]


def range_warnings(model: BaseModel, path: str = "") -> list[str]:
    """``section.key: expected …, got …`` for each number of ``model`` (a loaded config)
    outside its `Expected` range."""
    found = []
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        where = f"{path}.{name}" if path else name
        if isinstance(value, BaseModel):
            found += range_warnings(value, where)
            continue
        for at, item, expected in _numbers(value, info.annotation, where):
            if (problem := expected.problem(item)) is not None:
                found.append(f"{at}: {problem}; loaded, as synth-ai 0.4.4 loads it (its "
                             "schema sets no range): the backend decides")
    return found


def _numbers(value: Any, annotation: Any, where: str
             ) -> Iterator[tuple[str, Any, Expected]]:
    """(where, value, range) of each ranged number in ``value``, read off ``annotation``
    (a ranged number, an optional one, or a list or table of them)."""
    if value is None:
        return
    expected = _expected(annotation)
    if expected is not None:
        yield where, value, expected
        return
    inner = _element(annotation)
    if inner is None:
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            yield from _numbers(item, inner, f"{where}.{i}")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _numbers(item, inner, f"{where}.{key}")


def _expected(annotation: Any) -> Expected | None:
    if get_origin(annotation) is Annotated:
        return next((m for m in annotation.__metadata__ if isinstance(m, Expected)), None)
    for arg in get_args(annotation):  # `Count | None`
        if get_origin(arg) is Annotated and (found := _expected(arg)) is not None:
            return found
    return None


def _element(annotation: Any) -> Any:
    """The ranged element type of ``list[X]`` or ``dict[str, X]`` (optional or not)."""
    origin = get_origin(annotation)
    if origin is list:
        return get_args(annotation)[0]
    if origin is dict:
        return get_args(annotation)[1]
    for arg in get_args(annotation):
        if get_origin(arg) in (list, dict):
            return _element(arg)
    return None


__all__ = ["Count", "Every", "Expected", "Index", "NonNegative", "Port", "Positive",
           "Probability", "TopK", "range_warnings"]
