"""The two helpers every boundary uses (tracerl.io.files.boundary): one strict ASCII integer parser for every number
read from a peer, and one bounded listing for every error that names keys a file or a peer chose.

The attacker's side: a number a server or client writes may be any text: Unicode digits that `str.isdigit` accepts
and `int` refuses (superscripts) or accepts (Arabic-Indic, fullwidth), signs, underscores, blanks, a 5,000-digit
run, nothing at all. A file may hold a million keys. Each number is either the integer its ASCII digits spell or the
caller's error naming the field; each listing stays a few hundred characters whatever it is given.
"""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tracerl.io.files.boundary import listing, parse_int


class PeerError(Exception):
    """Stands for a call site's own error class (EngineError, BadRequest, CheckpointError)."""


HOSTILE = ["²", "²3", "١٢", "１２", "𝟗", "+1", " 1", "1 ", "\n1", "1_000", "", "-", "--1", "0x10", "1e3",
           "1.0", "9" * 5000, "\x00", "one"]


@pytest.mark.parametrize("text", HOSTILE, ids=[ascii(t[:12]) for t in HOSTILE])
def test_anything_but_ascii_digits_is_the_callers_error_naming_the_field(text):
    with pytest.raises(PeerError, match=r"Content-Length") as caught:
        parse_int(text, "Content-Length", PeerError)
    assert len(str(caught.value)) < 300, "the message must not echo a 5,000-character number"


@pytest.mark.parametrize("text", ["-1", "-0", "-12"])
def test_a_minus_sign_only_where_negatives_are_legal(text):
    with pytest.raises(PeerError, match="token_id"):
        parse_int(text, "token_id", PeerError)
    assert parse_int(text, "token_id", PeerError, negative=True) == int(text)


def test_the_length_is_bounded():
    assert parse_int("9" * 18, "n", PeerError) == int("9" * 18)
    with pytest.raises(PeerError, match=r"n .*digits"):
        parse_int("9" * 19, "n", PeerError)
    assert parse_int("123", "n", PeerError, max_digits=3) == 123
    with pytest.raises(PeerError):
        parse_int("1234", "n", PeerError, max_digits=3)


def test_a_non_string_is_the_callers_error_too():
    for value in (None, 12, b"12", 1.5, ["1"]):
        with pytest.raises(PeerError, match="field"):
            parse_int(value, "field", PeerError)


@given(st.integers(min_value=-10**18 + 1, max_value=10**18 - 1))
def test_every_integer_round_trips(n):
    assert parse_int(str(n), "n", PeerError, negative=True) == n


@given(st.text(max_size=25))
def test_exactly_the_ascii_integers_parse(text):
    legal = re.fullmatch(r"-?[0-9]{1,18}", text) is not None
    try:
        value = parse_int(text, "n", PeerError, negative=True)
    except PeerError:
        assert not legal, f"{text!r} is an ASCII integer and was refused"
    else:
        assert legal and value == int(text), f"{text!r} parsed as {value}"


# ---------------------------------------------------------------- bounded listings

def test_a_short_listing_is_the_sorted_list():
    assert listing(["b", "a"]) == "['a', 'b']"
    assert listing([]) == "[]"


def test_a_long_listing_names_the_first_few_then_counts_the_rest():
    text = listing(f"k{i:07d}" for i in range(1_000_000))
    assert len(text) < 200 and text.startswith("['k0000000', ") and text.endswith("and 999995 more"), text


def test_a_listing_bounds_each_name_too():
    text = listing(["x" * 1_000_000, "y"])
    assert len(text) < 300 and "'y'" in text, text[:300]


def test_a_listing_of_mixed_kinds_does_not_fail():
    assert listing([1, "a", None, 2.5]) == "['a', 1, 2.5, None]"


# ---------------------------------------------------------------- the other integers read from text
# (written after the fix, on the grep for `isdigit`: a command line and a config value, not a peer, but the same
# `isdigit` then `int` that took "²" to a bare ValueError and "١٢" to 12)

@pytest.mark.parametrize("text", ["²", "١٢", "１", "2-²", "0,³", "+3", "3_0"])
def test_seeds_on_the_command_line_are_ascii_digits(text):
    from tracerl.train.compare import parse_seeds

    with pytest.raises(ValueError, match="--seeds"):
        parse_seeds(text)


def test_seeds_on_the_command_line_still_parse():
    from tracerl.train.compare import parse_seeds

    assert parse_seeds("3") == [0, 1, 2] and parse_seeds("0,3") == [0, 3] and parse_seeds("2-4") == [2, 3, 4]


@pytest.mark.parametrize("device", ["cuda:²", "cuda:١", "cuda:+1", "cuda:-1", "cuda:"])
def test_a_cuda_index_is_ascii_digits(device):
    from tracerl.train.config import load_config

    with pytest.raises(ValueError, match=r"use cpu, cuda, cuda:N or auto"):
        load_config(None, [f"policy.device={device}"])
