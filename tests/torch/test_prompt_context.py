"""A row whose prompt the model's context cannot hold is refused when the trainer loads its rows, naming the row and
the fix, not at the first step that draws it (where it failed the whole batch)."""

import json

import pytest

pytest.importorskip("transformers")

from helpers import make_renderer, trainer_for  # noqa: E402

from tracerl.engines.tiny import tiny_qwen3  # noqa: E402
from tracerl.train.config import load_config  # noqa: E402


def _rows_file(path, questions):
    rows = [{"data_source": "mine", "prompt": [{"role": "user", "content": q}],
             "reward_model": {"style": "rule", "ground_truth": "4"}, "extra_info": {}} for q in questions]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("short-context")
    renderer = make_renderer(["What is 2+2?"] * 20, vocab_size=400)
    tiny_qwen3(vocab_size=400, max_position_embeddings=256).save_pretrained(path)
    renderer.tokenizer.save_pretrained(path)
    return path


def _config(model_dir, tmp_path, train, test):
    return load_config(None, [f"policy.model={model_dir}", f"run.out_dir={tmp_path / 'run'}", "method=grpo",
                              f"data.train_files={json.dumps([train])}", f"data.test_files={json.dumps([test])}",
                              "data.max_tokens_per_turn=32"])


@pytest.mark.parametrize("split", ["train", "test"])
def test_the_trainer_refuses_a_row_longer_than_the_context(model_dir, tmp_path, split):
    short = _rows_file(tmp_path / "short.jsonl", ["What is 2+2?"] * 2)
    long = _rows_file(tmp_path / "long.jsonl", ["What is 2+2?", "why " * 3000])
    train, test = (long, short) if split == "train" else (short, long)
    with pytest.raises(ValueError, match=rf"(?s){split} row 2\b.*256 positions"):
        trainer_for(_config(model_dir, tmp_path, train, test))


def test_the_trainer_loads_rows_that_fit(model_dir, tmp_path):
    short = _rows_file(tmp_path / "short.jsonl", ["What is 2+2?"] * 2)
    trainer = trainer_for(_config(model_dir, tmp_path, short, short))
    assert len(trainer.train_rows) == 2
    trainer.close()
