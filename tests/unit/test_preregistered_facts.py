"""studies/preregistered_facts.py: the figures of a pre-registered reading, read from its reports."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import load_study_script

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "studies" / "preregistered-default"


@pytest.fixture(scope="module")
def module():
    return load_study_script("preregistered_facts")


def test_the_default_testbeds_figures(module):
    """The figures its README states, read back from the committed reports."""
    text = module.facts(DEFAULT)
    for figure in ("38.5% all-fail, 29.6% mixed, 31.9% all-success", "`trace` 324,956",
                   "+0.65 [+0.46, +0.83] | [+0.46, +0.84]", "+0.02 [-0.15, +0.19]", "2 of 30 seeds never reach",
                   "| `trace` | 69% [61%, 76%] | 2 of 30 | 16 of 30 |",
                   "| `pcl` | 72% [64%, 84%] | 3 of 30 | 13 of 30 |",
                   "(sd 0.50; 27 of 30 positive)", "-0.046 [-0.063, -0.030] (0.344 against 0.390)"):
        assert figure in text, figure
    assert text == (DEFAULT / "facts.md").read_text()  # the committed file is this script's output


def test_reports_over_different_seeds_are_refused(module, tmp_path):
    folder = tmp_path / "preregistered-x"
    shutil.copytree(DEFAULT, folder, ignore=shutil.ignore_patterns("*.png", "frozen-tree"))
    vs_pcl = json.loads((folder / "vs-pcl" / "compare.json").read_text())
    vs_pcl["seeds"] = vs_pcl["seeds"][:-1]
    (folder / "vs-pcl" / "compare.json").write_text(json.dumps(vs_pcl))
    with pytest.raises(SystemExit, match="different seeds"):
        module.facts(folder)
