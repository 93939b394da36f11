"""`.synth-deploy/capacity.json` is a file a user may edit: a record that is not one
`rehearse` writes is ignored (as if never measured), whatever it holds, and `deploy
--dry-run` still plans."""

from __future__ import annotations

import json

import pytest

from synth_deploy.modal import ModalSettings
from synth_deploy.runs import capacity_warnings, measured_capacity

GOOD = {"app_id": "math", "sustained": 4, "knee": 2, "rollouts_per_s": 9.5, "limited": True,
        "measured_at": "2026-11-26 21:00"}


def written(tmp_path, records) -> object:
    path = tmp_path / "capacity.json"
    path.write_text(records if isinstance(records, str) else json.dumps(records))
    return path


def test_a_record_rehearse_wrote_is_read(tmp_path):
    measured = measured_capacity("math", written(tmp_path, {"math": GOOD}))
    assert (measured.sustained, measured.knee) == (4, 2)
    assert capacity_warnings(ModalSettings(concurrent_inputs=8), measured)


@pytest.mark.parametrize("change", [
    {"sustained": "4"}, {"sustained": None}, {"knee": None}, {"rollouts_per_s": "fast"},
    {"sustained": -4}, {"knee": -2}, {"sustained": 0}, {"knee": 9}, {"rollouts_per_s": -1},
    {"sustained": True}, {"limited": "yes"}, {"measured_at": 7}, {"sustained": 10 ** 30},
    {"rollouts_per_s": float("inf")},
])
def test_a_hand_edited_record_is_ignored(tmp_path, change):
    path = written(tmp_path, json.dumps({"math": {**GOOD, **change}}))
    measured = measured_capacity("math", path)
    assert measured is None
    assert capacity_warnings(ModalSettings(concurrent_inputs=8), measured) == []


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, "{not json", "[]", "null",
                                  '{"math": [1, 2]}', '{"math": "fast"}'])
def test_a_file_that_is_not_a_record_is_ignored(tmp_path, text):
    assert measured_capacity("math", written(tmp_path, text)) is None
