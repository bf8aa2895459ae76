"""verl's custom reward function for the ledger task: 1.0 iff the last number in the response is the balance."""

import re


def ledger_score(data_source, solution_str, ground_truth, extra_info=None):
    numbers = re.findall(r"-?\d+", solution_str)
    return float(bool(numbers) and numbers[-1] == str(ground_truth))
