"""The task's reward, in verl's custom reward signature: 1.0 iff the last <answer> is the vault's code."""

import re


def vault_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    answers = re.findall(r"<answer>(.*?)</answer>", solution_str, flags=re.S)
    return (1.0 + bonus) if answers and answers[-1].strip() == str(ground_truth) else 0.0
