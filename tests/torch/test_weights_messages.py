"""A state dict sent to `tracerl serve` (or handed to the vLLM engine) with a hundred thousand keys it does not
expect gets a refusal of a few hundred characters: the first few keys, then "and N more"."""

import torch

from tracerl.serve.weights import misfit


def test_a_state_dict_with_many_unexpected_keys_gets_a_short_message():
    expected = {"weight": torch.zeros(2, 2), "bias": torch.zeros(2)}
    state = {**expected, **{f"k{i:06d}": torch.zeros(1) for i in range(100_000)}}
    problem = misfit(expected, state)
    assert problem and len(problem) < 1000 and "more" in problem and "k000000" in problem, problem[:300]
    missing = misfit({f"w{i:06d}": torch.zeros(1) for i in range(100_000)}, {})
    assert missing and len(missing) < 1000 and "w000000" in missing, missing[:300]
