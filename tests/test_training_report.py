"""specaudit/weights/training_report.json is what scripts/train_reference_models.py writes
about the shipped weights: its keys, the weights' hashes, and what it could not reproduce
named (null, with the reason) rather than typed in."""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WEIGHTS = REPO / "specaudit" / "weights"


def _script():
    spec = importlib.util.spec_from_file_location("train_reference_models",
                                                  REPO / "scripts" / "train_reference_models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _keys(d: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in d.items():
        out.add(prefix + k)
        if isinstance(v, dict) and k not in ("written_by", "not_reproduced"):
            out |= _keys(v, f"{prefix}{k}.")
    return out


def test_the_report_is_the_scripts_output_for_the_shipped_weights():
    rep = json.loads((WEIGHTS / "training_report.json").read_text())
    assert "scripts/train_reference_models.py" in rep["written_by"]["command"]
    for k in ("commit", "date", "machine"):
        assert rep["written_by"][k], k
    for name in ("target", "drafter"):
        assert rep[name]["sha256"] == hashlib.sha256((WEIGHTS / f"{name}.safetensors").read_bytes()).hexdigest()
    # the structure the script writes, from fake figures: the same keys, nothing added by hand
    args = argparse.Namespace(target_steps=880, drafter_samples=16384, drafter_steps=3000)
    fake = _script()._report(WEIGHTS, args, 1.0, [0.5] * 8, 2.0, {"target": 1, "drafter_data": 1, "drafter": 1},
                             [], [], mode="x", prompts_written=False)
    extra = {"not_reproduced", "prompts.same_as_regenerated"}
    assert _keys(fake) <= _keys(rep) and _keys(rep) - _keys(fake) <= extra, _keys(rep) ^ _keys(fake)
    # what a report-only run could not measure is null, each with its reason
    for key, why in rep.get("not_reproduced", {}).items():
        section, leaf = key.split(".")
        assert rep[section][leaf] is None and why, key
    assert len(rep["drafter"]["match_by_offset_held_out_samples"]) == 8
    assert rep["prompts"]["count"] == len((REPO / "specaudit" / "data" / "prompts.jsonl").read_text().splitlines())
