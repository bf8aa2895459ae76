"""The seeds a comparison trains, in words: a bare number on the command line is a count, so the log must say it."""

import pytest

from tracerl.train.compare import describe_seeds, parse_seeds


@pytest.mark.parametrize("text, said", [("40", "seeds 0-39 (40)"), ("40-40", "seed 40"), ("0,3", "seeds 0, 3 (2)"),
                                        ("0-2,7", "seeds 0-2, 7 (4)"), ("3,5,6,9", "seeds 3, 5-6, 9 (4)")])
def test_the_seeds_are_said_as_ranges(text, said):
    assert describe_seeds(parse_seeds(text)) == said
