"""Typed configs from files and --set overrides (tracerl.io.config)."""

from dataclasses import dataclass, field

import pytest

from tracerl.core.methods import AllocationConfig
from tracerl.io.config import apply_overrides, from_dict, load_file, parse_override, to_dict


@dataclass(frozen=True)
class Inner:
    rate: float = 0.5  # a float field takes ints too
    count: int = 2
    name: str = "x"
    flag: bool = False
    cap: int | None = 4
    pair: tuple[float, float] = (0.9, 0.99)

    def __post_init__(self):
        if self.count < 1:
            raise ValueError(f"count={self.count} must be >= 1")


@dataclass(frozen=True)
class Outer:
    method: str = "trace"
    inner: Inner = field(default_factory=Inner)
    allocation: AllocationConfig = field(default_factory=AllocationConfig)


def test_round_trip_and_defaults():
    config = from_dict(Outer, {"inner": {"rate": 1, "cap": None, "pair": [0.8, 0.9]}, "allocation": {"k_max": 2}})
    assert config.inner == Inner(rate=1.0, cap=None, pair=(0.8, 0.9))
    assert isinstance(config.inner.rate, float) and config.allocation.k_max == 2
    assert from_dict(Outer, to_dict(config)) == config


@pytest.mark.parametrize("data, message", [
    ({"inner": {"rte": 1}}, r"inner: unknown key\(s\) \['rte'\]; known keys: \['cap', 'count'"),
    ({"inner": {"rate": "fast"}}, r"inner.rate: expected a number, got 'fast'"),
    ({"inner": {"count": 1.5}}, r"inner.count: expected an integer"),
    ({"inner": {"flag": 1}}, r"inner.flag: expected true or false"),
    ({"inner": {"pair": [1]}}, r"inner.pair: expected 2 values"),
    ({"inner": 3}, r"inner is a section"),
    ({"inner": {"count": 0}}, r"inner: count=0 must be >= 1"),
    ({"allocation": {"m_min": 5, "m_max": 3}}, r"m_max=3 < m_min=5; raise m_max or lower m_min"),
    ({"methd": "x"}, r"unknown key\(s\) \['methd'\]"),
])
def test_bad_values_name_the_key_and_the_fix(data, message):
    with pytest.raises(ValueError, match=message):
        from_dict(Outer, data, where="")


def test_overrides_parse_json_then_fall_back_to_strings():
    assert parse_override("optim.lr=3e-4") == (["optim", "lr"], 3e-4)
    assert parse_override("allocation.k_max=null") == (["allocation", "k_max"], None)
    assert parse_override("method=trace") == (["method"], "trace")
    assert parse_override("policy.embedded={\"sft_steps\": 5}") == (["policy", "embedded"], {"sft_steps": 5})
    data = apply_overrides({"inner": {"rate": 0.1}}, ["inner.count=3", "method=grpo", "allocation.k_max=null"])
    assert data == {"inner": {"rate": 0.1, "count": 3}, "method": "grpo", "allocation": {"k_max": None}}
    with pytest.raises(ValueError, match="write key=value"):
        parse_override("optim.lr")
    with pytest.raises(ValueError, match="'method' is a value, not a section"):
        apply_overrides({"method": "x"}, ["method.sub=1"])


def test_files(tmp_path):
    (tmp_path / "a.toml").write_text('method = "grpo"\n[inner]\nrate = 2\n')
    (tmp_path / "a.json").write_text('{"method": "pcl"}')
    (tmp_path / "bad.toml").write_text("method = \n")
    assert from_dict(Outer, load_file(tmp_path / "a.toml")).inner.rate == 2.0
    assert load_file(tmp_path / "a.json") == {"method": "pcl"}
    with pytest.raises(ValueError, match="does not parse"):
        load_file(tmp_path / "bad.toml")
    with pytest.raises(ValueError, match="does not exist"):
        load_file(tmp_path / "missing.toml")
    (tmp_path / "a.yaml").write_text("x: 1")
    with pytest.raises(ValueError, match="use a .toml or .json file"):
        load_file(tmp_path / "a.yaml")
