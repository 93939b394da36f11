"""How much does validating SFT JSONL cost over just parsing it?

Writes a synthetic file (default 50,000 chat examples), then times, in the same run:
  baseline  json.loads of every line (the least any validator must do)
  validate  synth_deploy.train.validate_sft_file (parse + schema, errors by line)
and prints the ratio. Run: python bench/sft_validate.py [N]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from synth_deploy.train import validate_sft_file


def make_file(path: Path, n: int) -> None:
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"messages": [
                {"role": "system", "content": "Answer with the number only."},
                {"role": "user", "content": f"What is {i} + {i}?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": f"c{i}", "type": "function",
                     "function": {"name": "add", "arguments": json.dumps({"a": i, "b": i})}}]},
                {"role": "tool", "tool_call_id": f"c{i}", "content": str(2 * i)},
                {"role": "assistant", "content": str(2 * i)},
            ], "metadata": {"i": i}}) + "\n")


def best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.jsonl"
        make_file(path, n)

        def baseline() -> None:
            with path.open(encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        json.loads(line)

        size_mb = path.stat().st_size / 1e6
        result = validate_sft_file(path)
        assert result.ok and result.count == n, result.errors[:3]
        base = best_of(baseline)
        validate = best_of(lambda: validate_sft_file(path))
    print(f"examples: {n} ({size_mb:.1f} MB)")
    print(f"baseline json.loads: {base:.3f}s ({n / base:,.0f} lines/s)")
    print(f"validate_sft_file:   {validate:.3f}s ({n / validate:,.0f} lines/s)")
    print(f"ratio validate/baseline: {validate / base:.2f}x")


if __name__ == "__main__":
    main()
