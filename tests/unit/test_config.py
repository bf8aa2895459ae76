"""Typed configs from files and --set overrides (tracerl.io.files.config)."""

from dataclasses import dataclass, field

import pytest

from tracerl.core.methods import AllocationConfig
from tracerl.io.files.config import apply_overrides, from_dict, load_file, parse_override, to_dict


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


# ---------------------------------------------------------------- hostile config files and values
# What TOML and JSON allow that a config must not accept: nesting deep enough to exhaust the parser's stack, bytes
# that are not UTF-8, integers too long to convert, repeated keys (JSON keeps the last silently), NaN and infinity,
# numbers too large for a float, huge files, and templates whose placeholders fail (or allocate) only when used.
# Each must be a ValueError that names the file or the key, at load.

import math  # noqa: E402

from tracerl.train.config import load_config  # noqa: E402


@dataclass(frozen=True)
class WithOptions:
    options: dict = field(default_factory=dict)
    rate: float = 0.5


@pytest.mark.parametrize("name, text", [
    ("deep.toml", "a = " + "[" * 100_000 + "]" * 100_000 + "\n"),
    ("deep_table.toml", "a = " + "{b = " * 100_000 + "1" + "}" * 100_000 + "\n"),
    ("deep.json", "[" * 100_000 + "]" * 100_000),
    ("long_int.json", '{"run": {"seed": ' + "9" * 5000 + "}}"),
    ("long_int.toml", "[run]\nseed = " + "9" * 5000 + "\n"),
    ("repeated.json", '{"method": "grpo", "method": "trace"}'),
    ("nan.json", '{"inner": {"rate": NaN}}'),
    ("inf.json", '{"inner": {"rate": -Infinity}}'),
    ("huge.toml", "# padding\n" * 300_000 + 'method = "grpo"\n'),
])
def test_a_hostile_file_is_a_clear_error_naming_it(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=f"config file {path}") as caught:
        load_file(path)
    assert not isinstance(caught.value, UnicodeError)


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_bytes_that_are_not_utf8_name_the_file(tmp_path, suffix):
    path = tmp_path / f"latin1{suffix}"
    path.write_bytes(b'method = "gr\xf6po"\n' if suffix == ".toml" else b'{"method": "gr\xf6po"}')
    with pytest.raises(ValueError, match=f"config file {path}.*UTF-8"):
        load_file(path)


@pytest.mark.parametrize("value", [math.nan, math.inf, 10**400], ids=["nan", "inf", "10**400"])
def test_a_float_field_takes_only_finite_numbers(value):
    with pytest.raises(ValueError, match=r"inner\.rate.*finite number"):
        from_dict(Outer, {"inner": {"rate": value}}, where="")


@pytest.mark.parametrize("options", [{"l2": math.nan}, {"deep": [{"x": math.inf}]}, {"low": -math.inf}])
def test_a_table_field_holds_no_nan_or_infinity(options):
    with pytest.raises(ValueError, match=r"options.*finite"):
        from_dict(WithOptions, {"options": options}, where="")


def test_a_deeply_nested_override_is_a_clear_error():
    with pytest.raises(ValueError, match="--set"):
        parse_override("policy.embedded=" + "[" * 100_000 + "]" * 100_000)


@pytest.mark.parametrize("template, words", [
    ("runs/{nope}", "{nope}"),
    ("runs/{seed:>999999999}", "format"),
    ("runs/{method.__class__}", "{method.__class__}"),
    ("runs/{method[0]}", "{method[0]}"),
    ("runs/{method!r}", "conversion"),
    ("runs/{", "brace"),
    ("runs/}", "brace"),
    ("runs/{}", "{}"),
])
def test_a_template_is_checked_at_load_not_when_first_used(template, words):
    with pytest.raises(ValueError, match=r"run\.out_dir.*" + __import__("re").escape(words)):
        load_config(None, [f"run.out_dir={template}"], machine=False)


def test_a_good_template_still_loads():
    config = load_config(None, ["run.out_dir=runs/{method}/{seed}-{{literal}}", "run.seed=3"], machine=False)
    assert str(config.out_dir()) == "runs/trace/3-{literal}"


# ---------------------------------------------------------------- written after the fix

@pytest.mark.parametrize("kind", ["fifo", "folder", "device"])
def test_a_config_path_that_is_not_a_regular_file_is_named_without_blocking(tmp_path, kind):
    import os

    path = tmp_path / "c.toml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")
    with pytest.raises(ValueError, match=f"config file {path} is not a regular file"):
        load_file(path)


@pytest.mark.parametrize("text", ["[1, 2]", '"trace"', "null"])
def test_a_json_config_is_a_table(tmp_path, text):
    (tmp_path / "c.json").write_text(text)
    with pytest.raises(ValueError, match="not a table of keys"):
        load_file(tmp_path / "c.json")


@pytest.mark.parametrize("override, words", [
    ("policy.embedded={\"lr\": NaN}", r"policy\.embedded\.lr=nan must be a finite number"),
    ("predictor.options={\"l2\": [1, Infinity]}", r"predictor\.options\.l2\[1\]=inf must be a finite number"),
    ("optim.lr=NaN", r"optim\.lr=nan must be a finite number > 0"),
    ("optim.lr=" + "1" * 400, r"optim\.lr=1111.* must be a finite number"),
    ("run.seed=" + "9" * 5000, r"--set run\.seed=\.\.\.: .*digits"),
])
def test_overrides_are_checked_like_files(override, words):
    with pytest.raises(ValueError, match=words):
        load_config(None, [override], machine=False)


def test_a_knob_in_a_toml_file_keeps_its_range_in_the_message(tmp_path):
    (tmp_path / "c.toml").write_text("[optim]\nlr = nan\n")
    with pytest.raises(ValueError, match=r"optim\.lr=nan must be a finite number > 0"):
        load_config(tmp_path / "c.toml", machine=False)


def test_template_names_come_from_the_default():
    from tracerl.io.files.config import template_names

    assert template_names("runs/{method}-seed{seed}") == ("method", "seed")
    assert template_names("plain") == () and template_names("{") == () and template_names(None) == ()


def test_predictor_options_are_checked_against_the_predictor_at_load():
    from tracerl.train.config import load_config

    with pytest.raises(ValueError, match=r"predictor.options has \['l3'\], which hashed_logistic does not take"):
        load_config(None, ['predictor.options={"l3": 1}'])
    with pytest.raises(ValueError, match="the predictor's seed is run.seed"):
        load_config(None, ['predictor.options={"seed": 3}'])
    assert load_config(None, ['predictor.options={"l2": 0.5}']).predictor.options == {"l2": 0.5}


# ---------------------------------------------------------------- nesting deep enough for a recursive walk
# Nesting a parser accepts (TOML's dotted keys and table headers are parsed in a loop, at any depth) but deeper than
# any config needs: every walk over the data (from_dict, apply_overrides, to_dict, the key listing a resume compares)
# would end in RecursionError. Refused at load, naming the file and the depth limit.

def _dotted(depth):
    return ".".join(["a"] * depth)


DEEP = 3000


@pytest.mark.parametrize("name, text", [
    ("dotted.toml", f"{_dotted(DEEP)} = 1\n"),
    ("header.toml", f"[{_dotted(DEEP)}]\nx = 1\n"),
    ("array_of_tables.toml", f"[[{_dotted(DEEP)}]]\nx = 1\n"),
    ("inline.toml", "a = " + "{b = " * DEEP + "1" + "}" * DEEP + "\n"),
    ("arrays.toml", "a = " + "[" * DEEP + "]" * DEEP + "\n"),
    ("mixed.toml", f"[predictor.options]\n{_dotted(DEEP // 2)} = " + "{b = " * (DEEP // 2) + "1" + "}" * (DEEP // 2)),
    ("objects.json", '{"a": ' * DEEP + "1" + "}" * DEEP),
    ("arrays.json", '{"a": ' + "[" * DEEP + "]" * DEEP + "}"),
    ("medium.toml", f"[predictor.options]\n{_dotted(200)} = 1\n"),  # far from the stack, still no config's shape
])
def test_a_config_file_nested_deep_names_the_file_and_the_depth_limit(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    for load in (load_file, load_config):
        with pytest.raises(ValueError, match=rf"config file {path}.*(deep|depth).*\d") as caught:
            load(path)
        assert not isinstance(caught.value, RecursionError)


@pytest.mark.parametrize("override", [
    f"{_dotted(DEEP)}=1",
    "predictor.options=" + '{"a": ' * DEEP + "1" + "}" * DEEP,
    f"predictor.options.{_dotted(200)}=1",
])
def test_a_set_nested_deep_names_the_depth_limit(override):
    with pytest.raises(ValueError, match=r"--set.*(deep|depth).*\d"):
        load_config(None, [override])


def test_walks_over_data_nested_deep_are_bounded_errors_not_recursion():
    deep = 1
    for _ in range(DEEP):
        deep = {"a": deep}
    with pytest.raises(ValueError, match=r"(deep|depth).*\d"):
        from_dict(WithOptions, {"options": deep}, where="")
    with pytest.raises(ValueError, match=r"(deep|depth).*\d"):
        apply_overrides({"options": deep}, ["rate=1"])
    from tracerl.train.config import config_changes

    with pytest.raises(ValueError, match=r"(deep|depth).*\d"):
        config_changes({"options": deep}, {"options": {}})


def test_real_nesting_still_loads(tmp_path):
    path = tmp_path / "ok.toml"
    path.write_text('[predictor.options]\nl2 = 0.1\n[policy]\nembedded = {hops = [2, 3], sft_steps = 5}\n')
    config = load_config(path)
    assert config.predictor.options == {"l2": 0.1} and config.to_dict()["policy"]["embedded"]["hops"] == [2, 3]


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_bytes_that_are_not_utf8_name_the_byte_offset_and_the_fix(tmp_path, suffix):
    path = tmp_path / f"latin1{suffix}"
    data = b'# a comment\nmethod = "gr\xf6po"\n' if suffix == ".toml" else b'{\n  "method": "gr\xf6po"}'
    path.write_bytes(data)
    for load in (load_file, load_config):
        with pytest.raises(ValueError, match=rf"config file {path}.*byte {data.index(0xf6)}.*save it as UTF-8"):
            load(path)
