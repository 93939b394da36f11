"""`PriceTable`: what a model's tokens cost, from a small TOML file, for cost estimates.

    # prices.toml: US dollars per million tokens, by the model name the LM calls recorded
    [models."gpt-4o-mini"]
    input_per_million = 0.15
    output_per_million = 0.60

    [models."Qwen/Qwen3-*"]          # a trailing * matches every name it starts
    input_per_million = 0.0
    output_per_million = 0.0

Given with ``--prices FILE`` or ``SYNTH_PRICES`` (resolved by the command, `resolve_price_table`),
it turns a `CostLedger`'s tokens per model into an estimate; models it does not list are
named, never priced at zero.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synth_deploy.env import Env
from synth_deploy.errors import UsageError
from synth_deploy.tracing._ledger import CostLedger

PRICES_VAR = "SYNTH_PRICES"
_FIELDS = ("input_per_million", "output_per_million")
_EXAMPLE = ('[models."gpt-4o-mini"] with input_per_million = 0.15 and '
            "output_per_million = 0.60")


@dataclass(frozen=True)
class ModelPrice:
    """US dollars per million input and output tokens."""

    input_per_million: float
    output_per_million: float


@dataclass(frozen=True)
class CostEstimate:
    """A ledger priced: ``usd`` for the models the table lists; ``unpriced`` names the others
    that used tokens (their tokens are not in ``usd``)."""

    usd: float
    unpriced: tuple[str, ...] = ()
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"usd": round(self.usd, 8), "unpriced_models": list(self.unpriced),
                "prices": self.source}


@dataclass(frozen=True)
class PriceTable:
    """Prices by model name (exact names first, then ``*`` patterns, longest first)."""

    prices: dict[str, ModelPrice] = field(default_factory=dict)
    source: str = ""

    def price_of(self, model: str) -> ModelPrice | None:
        if model in self.prices:
            return self.prices[model]
        patterns = sorted((p for p in self.prices if "*" in p), key=len, reverse=True)
        for pattern in patterns:
            if fnmatch.fnmatchcase(model, pattern):
                return self.prices[pattern]
        return None

    def estimate(self, ledger: CostLedger) -> CostEstimate:
        usd, unpriced = 0.0, []
        for model, tokens in sorted(ledger.by_model.items()):
            price = self.price_of(model)
            if price is None:
                if tokens.input_tokens or tokens.output_tokens:
                    unpriced.append(model)
                continue
            usd += (tokens.input_tokens * price.input_per_million
                    + tokens.output_tokens * price.output_per_million) / 1_000_000
        return CostEstimate(usd, tuple(unpriced), self.source)


def load_price_table(path: str | Path) -> PriceTable:
    """Read a price file; a `UsageError` naming file:line and the fix when it is wrong."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"price file not found: {path}",
                         hint=f"create it with {_EXAMPLE}, or drop --prices / "
                              f"{PRICES_VAR}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read price file {path}: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = re.search(r"line (\d+)", str(exc))
        where = f"{path}:{line.group(1)}" if line else str(path)
        raise UsageError(f"{where}: not valid TOML ({exc})",
                         hint=f"write one table per model: {_EXAMPLE}") from None
    models = data.get("models")
    if not isinstance(models, dict) or not models:
        raise UsageError(f"{path}: no [models.\"NAME\"] tables",
                         hint=f"write one table per model: {_EXAMPLE}")
    prices = {}
    for name, entry in models.items():
        where = f"{path}:{_line_of(text, name)}"
        if not isinstance(entry, dict):
            raise UsageError(f"{where}: models.{name!r} must be a table",
                             hint=f"write it as {_EXAMPLE}")
        unknown = sorted(set(entry) - set(_FIELDS))
        if unknown:
            raise UsageError(f"{where}: models.{name!r} has unknown field(s) "
                             f"{', '.join(unknown)}", hint=f"the fields are {', '.join(_FIELDS)}")
        values = []
        for key in _FIELDS:
            value = entry.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise UsageError(f"{where}: models.{name!r}.{key} must be a number ≥ 0 "
                                 f"(US dollars per million tokens), got {value!r}",
                                 hint=f"write it as {_EXAMPLE}")
            values.append(float(value))
        prices[str(name)] = ModelPrice(*values)
    return PriceTable(prices, str(path))


def resolve_price_table(flag: str | Path | None, env: Env) -> PriceTable | None:
    """``--prices FILE``, else ``SYNTH_PRICES``, else no price table (no estimate)."""
    chosen = flag if flag else env.get(PRICES_VAR)
    return load_price_table(chosen) if chosen else None


def _line_of(text: str, name: str) -> int:
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("[") and name in stripped:
            return number
    return 1


__all__ = ["PRICES_VAR", "CostEstimate", "ModelPrice", "PriceTable", "load_price_table",
           "resolve_price_table"]
