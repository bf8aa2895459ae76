"""Multi-hop QA domain: generated world, splits, BM25 search, expert vs random policy, loaders, bad output."""

import json
import math

import numpy as np
import pytest

from tracerl.io.domains.multihop import (
    RELATIONS, MultiHopDomain, MultiHopEnv, all_questions, exact_match, load_corpus, load_qa_file, make_kb,
    normalize_answer,
)
from tracerl.io.domains.retrieval import BM25Index, tokenize


@pytest.fixture(scope="module")
def domain():
    return MultiHopDomain()


def play(env, row, policy, max_turns=12):
    """Run one episode; returns (reward, [(action, observation), ...])."""
    env.reset(row)
    turns = []
    for _ in range(max_turns):
        action = policy(row, turns)
        result = env.step(action)
        if result.done:
            return result.reward, turns
        turns.append((action, result.observation))
    return 0.0, turns


def call(name, **arguments):
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


# -- world and questions

def test_kb_is_deterministic_by_seed():
    a, b, c = make_kb(80, 20, seed=3), make_kb(80, 20, seed=3), make_kb(80, 20, seed=4)
    assert a.documents == b.documents and a.entities == b.entities
    assert a.documents != c.documents, "a different seed should give a different world"
    assert len(a.documents) == 100 and sum(e.distractor for e in a.entities.values()) == 20


def test_documents_state_facts_and_distractors_look_alike(domain):
    kb = domain.kb
    titles = [d["title"] for d in kb.documents]
    assert len(set(titles)) == len(titles) == len(kb.entities)
    for doc in kb.documents:
        entity = kb.entities[doc["title"]]
        for rel, obj in entity.facts.items():
            assert RELATIONS[rel].sentence.format(s=entity.name, o=obj) in doc["text"]
            assert not kb.entities[obj].distractor, "no fact may point into a distractor"
        assert len(f"{doc['title']}: {doc['text']}") < domain.max_doc_chars, "results must not be cut mid-name"
    real_words = {w for n, e in kb.entities.items() if not e.distractor for w in n.split()}
    distractors = [n for n, e in kb.entities.items() if e.distractor]
    assert all(set(n.split()) & real_words for n in distractors), "every distractor shares a word with a real name"


def test_questions_follow_the_facts_to_a_unique_answer(domain):
    kb = domain.kb
    for split in ("train", "test"):
        for row in domain.rows(split, 300, seed=1):
            info = row["extra_info"]
            assert 2 <= info["hops"] == len(info["relations"]) <= 4
            entity, seen = info["start"], [info["start"]]
            for rel in info["relations"]:
                entity = kb.entities[entity].facts[rel]
                seen.append(entity)
            assert entity == row["reward_model"]["ground_truth"] == info["path"][-1]
            assert len(set(seen)) == len(seen), f"chain revisits an entity: {seen}"
            assert not any(kb.entities[e].distractor for e in seen)
            assert info["start"] in row["prompt"][-1]["content"]
    texts = [q.text for q in all_questions(kb, 2, 4)]
    assert len(set(texts)) == len(texts), "two chains read the same, so a question would have two answers"


def test_splits_are_disjoint_deterministic_and_share_entities(domain):
    train, test = domain.rows("train", 1000, seed=0), domain.rows("test", 100, seed=0)
    text = lambda rows: [r["prompt"][-1]["content"] for r in rows]  # noqa: E731
    assert not set(text(train)) & set(text(test))
    assert len(set(text(test))) == 100, "rows within a split are distinct questions"
    assert text(domain.rows("test", 100, seed=0)) == text(test)
    assert text(domain.rows("test", 100, seed=1)) != text(test)
    assert {r["extra_info"]["hops"] for r in test} == {2, 3, 4}
    seen = {e for r in train for e in [r["extra_info"]["start"], *r["extra_info"]["path"]]}
    unseen = {e for r in test for e in [r["extra_info"]["start"], *r["extra_info"]["path"]]} - seen
    assert not unseen, f"test entities never seen in training: {sorted(unseen)[:5]}"


def test_every_split_keeps_the_hop_mix_even_when_short_questions_run_out():
    small = MultiHopDomain(num_entities=40, num_distractors=0, hops=(1, 3), hop_mix=(1, 1, 2))
    pool = small.questions("train")
    assert len(pool[1]) < 600 / 4, "premise: fewer 1-hop questions than the mix asks for"
    for split in ("train", "test"):
        hops = [r["extra_info"]["hops"] for r in small.rows(split, 600, seed=5)]
        assert abs(hops.count(1) / 600 - 0.25) < 0.06 and abs(hops.count(3) / 600 - 0.5) < 0.06, hops[:20]
    first = small.rows("train", len(pool[1]) // 2, seed=5)
    texts = [r["prompt"][-1]["content"] for r in first]
    assert len(set(texts)) == len(texts), "rows are distinct until a stratum runs out"


def test_the_warm_start_can_have_its_own_hop_mix():
    domain = MultiHopDomain(num_entities=60, num_distractors=10, hops=(1, 3), warmup_fraction=0.3,
                            warmup_hop_mix=(1, 1, 0))
    warm = [r["extra_info"]["hops"] for r in domain.rows("warmup", 300, seed=0)]
    train = [r["extra_info"]["hops"] for r in domain.rows("train", 300, seed=0)]
    assert 3 not in warm and abs(warm.count(1) / 300 - 0.5) < 0.1
    assert abs(train.count(3) / 300 - 1 / 3) < 0.1, "the warm start's mix leaked into the training rows"
    with pytest.raises(ValueError, match="warmup_hop_mix"):
        MultiHopDomain(hops=(1, 3), warmup_hop_mix=(1, 1))


def test_warmup_questions_are_apart_from_train_and_test():
    domain = MultiHopDomain(num_entities=60, num_distractors=10, warmup_fraction=0.3)
    text = lambda rows: {r["prompt"][-1]["content"] for r in rows}  # noqa: E731
    warm, train, test = (text(domain.rows(s, 300, seed=0)) for s in ("warmup", "train", "test"))
    assert not warm & train and not warm & test and not train & test
    shared = MultiHopDomain(num_entities=60, num_distractors=10)
    train_pool = {q.text for qs in shared.questions("train").values() for q in qs}
    assert text(shared.rows("warmup", 50, seed=0)) <= train_pool, \
        "without warmup_fraction the warm start draws from the training questions"


def test_unanswerable_questions_need_a_document_missing_from_the_corpus():
    domain = MultiHopDomain(num_entities=80, num_distractors=20, hops=(1, 3), missing_share=0.2,
                            unanswerable_share=0.3)
    titles = {d["title"] for d in domain.index.documents}
    rows = domain.rows("train", 400, seed=1)
    closed = [r for r in rows if not r["extra_info"]["answerable"]]
    assert 0.22 < len(closed) / len(rows) < 0.38
    for r in rows:
        needed = [r["extra_info"]["start"], *r["extra_info"]["path"][:-1]]
        assert bool(set(needed) & domain.missing) != r["extra_info"]["answerable"]
    assert titles and not titles & domain.missing
    env = domain.make_env()
    for r in closed[:20]:  # the expert's search for the missing entity never shows its document
        env.reset(r)
        entity = next(e for e in [r["extra_info"]["start"], *r["extra_info"]["path"][:-1]] if e in domain.missing)
        result = env.step(call("search", query=entity))
        assert not any(line.startswith(f"{entity}: ") for line in result.observation.splitlines())
    with pytest.raises(ValueError, match="needs missing_share"):
        MultiHopDomain(unanswerable_share=0.2)


def test_bad_options_and_oversized_requests_raise_clearly():
    with pytest.raises(ValueError, match="hops"):
        MultiHopDomain(hops=(3, 2))
    with pytest.raises(ValueError, match="lower num_distractors"):
        make_kb(20, 200, seed=0)
    with pytest.raises(ValueError, match="hop_mix"):
        MultiHopDomain(hops=(1, 3), hop_mix=(1, 1))
    small = MultiHopDomain(num_entities=20, num_distractors=0, hops=(1, 2), missing_share=0.01,
                           unanswerable_share=0.5)
    with pytest.raises(ValueError, match="raise num_entities"):
        small.rows("test", 500)
    with pytest.raises(ValueError, match="expected 'train', 'test' or 'warmup'"):
        small.rows("valid", 1)


# -- BM25

def test_bm25_finds_every_entity_by_its_exact_name(domain):
    for name, entity in domain.kb.entities.items():
        top = domain.index.search(name, 1)
        assert top and top[0]["title"] == name, f"query {name!r} returned {top[:1]}"


def test_bm25_scores_match_the_formula_computed_by_hand():
    docs = [{"id": "a", "title": "Red fox", "text": "the fox jumps over the dog"},
            {"id": "b", "title": "Dog", "text": "a dog sleeps; a dog dreams"},
            {"id": "c", "title": "Cat", "text": "cats nap"}]
    index, k1, b = BM25Index(docs), 1.5, 0.75
    tokens = [tokenize(f"{d['title']} {d['text']}") for d in docs]
    avgdl = sum(map(len, tokens)) / len(tokens)

    def by_hand(query):
        out = []
        for toks in tokens:
            s = 0.0
            for q in tokenize(query):
                df, tf = sum(q in t for t in tokens), toks.count(q)
                s += math.log(1 + (3 - df + 0.5) / (df + 0.5)) * tf / (tf + k1 * (1 - b + b * len(toks) / avgdl))
            out.append(s)
        return out

    for query in ["dog", "fox dog", "dog dog sleeps", "nothing here"]:
        np.testing.assert_allclose(index.scores(query), by_hand(query), rtol=1e-12)
    assert [d["id"] for d in index.search("dog", 3)] == ["b", "a"], "zero-score documents are not returned"
    assert index.search("zebra", 3) == [] and index.search("dog", 0) == []


def test_bm25_breaks_ties_by_document_order():
    docs = [{"id": str(i), "title": "", "text": "same words here"} for i in range(5)]
    assert [d["id"] for d in BM25Index(docs).search("words", 3)] == ["0", "1", "2"]


# -- environment, expert and a random policy

def test_expert_solves_test_questions_against_the_real_env(domain):
    rows, rng = domain.rows("test", 100, seed=0), np.random.default_rng(0)
    rewards = [play(domain.make_env(), row, lambda r, t: domain.expert_turn(r, t, rng))[0] for row in rows]
    assert np.mean(rewards) >= 0.95, f"expert success {np.mean(rewards):.2f}"


def test_expert_retries_then_gives_up_when_search_never_shows_the_entity(domain):
    row, rng = domain.rows("test", 1)[0], np.random.default_rng(0)
    first = domain.expert_turn(row, [], rng)
    start = row["extra_info"]["start"]
    assert f'"query": "{start} ' in first
    retry = domain.expert_turn(row, [(first, "no documents found")], rng)
    assert f'"query": "{start}"' in retry
    gave_up = domain.expert_turn(row, [(first, "no documents found"), (retry, "no documents found")], rng)
    assert gave_up.endswith(f"<answer>{start}</answer>")


def test_random_policy_almost_never_succeeds(domain):
    rng = np.random.default_rng(0)
    names, words = sorted(domain.kb.entities), [w for n in domain.kb.entities for w in n.split()]

    def policy(row, turns):
        roll = rng.random()
        if roll < 0.3 or len(turns) >= 8:
            return f"<answer>{names[rng.integers(len(names))]}</answer>"
        if roll < 0.8:
            return call("search", query=" ".join(rng.choice(words, rng.integers(1, 4))))
        return "".join(rng.choice(list("ab <>{}\":"), rng.integers(1, 60)))

    rewards = [play(domain.make_env(), row, policy)[0] for row in domain.rows("test", 200, seed=2)]
    assert np.mean(rewards) <= 0.05, f"random success {np.mean(rewards):.2f}"


@pytest.mark.parametrize("action", [
    '<tool_call>{"name": "search", "arguments": {"query": "x"</tool_call>',  # bad JSON
    call("lookup", query="Pelora"),  # unknown tool
    call("search", query=7),  # wrong argument type
    call("search", q="Pelora"),  # wrong argument name
    call("search"),  # missing argument
    call("search", query="   "),  # empty query
    "I think I know.",  # neither a tool call nor an answer
    "x" * 100_000,  # 100 KB of text
    "<tool_call>" + "[" * 50_000,  # deeply nested garbage
])
def test_malformed_output_becomes_an_error_observation(domain, action):
    env = domain.make_env()
    env.reset(domain.rows("test", 1)[0])
    result = env.step(action)
    assert result.tool_error and not result.done and result.observation.startswith("error")
    assert env.state["queries"] == [], "a failed call must not count as a search"


def test_search_output_is_capped_and_answers_are_scored(domain):
    env, row = domain.make_env(), domain.rows("test", 1)[0]
    env.reset(row)
    result = env.step(call("search", query=" ".join(sorted(domain.kb.entities))))
    assert not result.tool_error and len(result.observation.splitlines()) == domain.search_k
    assert len(env.state["queries"][0]) <= env.max_query_chars
    assert env.tools()[0]["function"]["name"] == "search"
    answer = row["reward_model"]["ground_truth"]
    assert env.step(f"so <answer> The {answer.upper()}. </answer>").reward == 1.0
    assert env.step("<answer>Nowhere</answer>").reward == 0.0


def test_snapshot_restore_resumes_the_same_state(domain):
    env, row = domain.make_env(), domain.rows("test", 1)[0]
    env.reset(row)
    env.step(call("search", query="alpha"))
    snap = env.snapshot()
    later = env.step(call("search", query=row["extra_info"]["start"]))
    env.step(call("search", query="gamma"))
    env.restore(snap)
    assert env.state["queries"] == ["alpha"]
    again = env.step(call("search", query=row["extra_info"]["start"]))
    assert again.observation == later.observation and env.state["queries"] == ["alpha", row["extra_info"]["start"]]
    env.restore(snap)
    assert env.state["queries"] == ["alpha"], "the snapshot must not share state with the live env"


@pytest.mark.parametrize("prediction,truth,expected", [
    ("The Eiffel Tower", "eiffel tower", 1.0),
    ("  eiffel,   tower!! ", "Eiffel Tower", 1.0),
    ("an apple", "Apple", 1.0),
    ("Théâtre", "théâtre", 1.0),
    ("Paris, France", "Paris", 0.0),
    ("", "", 0.0),
    ("the", "a", 0.0),
    ("NYC", ["New York City", "nyc"], 1.0),
    ("Boston", ["New York City", "NYC"], 0.0),
])
def test_exact_match_normalises_like_squad(prediction, truth, expected):
    assert exact_match(prediction, truth) == expected


def test_normalize_answer():
    assert normalize_answer("  The  U.S.A.'s   capital ") == "usas capital"
    assert normalize_answer("Theatre an Anthem") == "theatre anthem"


# -- loaders

def write(path, records, jsonl):
    path.write_text("\n".join(map(json.dumps, records)) if jsonl else json.dumps(records))
    return path


HOTPOT = {"_id": "h1", "question": "Which city hosts Quilt Labs?", "answer": "Pelora", "type": "bridge",
          "context": [["Quilt Labs", ["Quilt Labs is a firm.", " It sits in Pelora."]],
                      ["Pelora", ["Pelora is a city."]]]}
TWOWIKI = {"_id": "w1", "question": "Who founded Quilt Labs?", "answer": "Arlo Venn", "type": "compositional",
           "context": [["Quilt Labs", ["Quilt Labs is a firm.", "It sits in Pelora."]],
                       ["Arlo Venn", ["Arlo Venn founded Quilt Labs."]]]}
MUSIQUE = {"id": "m1", "question": "Where was Arlo Venn born?", "answer": "Pelora", "answer_aliases": ["Pelora City"],
           "paragraphs": [{"idx": 0, "title": "Arlo Venn", "paragraph_text": "Arlo Venn was born in Pelora.",
                           "is_supporting": True}]}


@pytest.mark.parametrize("records,jsonl", [([HOTPOT, TWOWIKI], False), ([MUSIQUE, HOTPOT], True)])
def test_load_qa_file_builds_rows_and_a_searchable_corpus(tmp_path, records, jsonl):
    rows, corpus = load_qa_file(write(tmp_path / "qa.json", records, jsonl))
    assert [r["prompt"][-1]["content"] for r in rows] == [r["question"] for r in records]
    assert rows[0]["reward_model"]["ground_truth"][0] == records[0]["answer"]
    assert rows[0]["extra_info"]["id"] == records[0].get("_id", records[0].get("id"))
    assert len({(d["title"], d["text"]) for d in corpus}) == len(corpus), "context paragraphs are deduplicated"
    env = MultiHopEnv(BM25Index(corpus))
    env.reset(rows[0])
    observation = env.step(call("search", query="Quilt Labs")).observation
    assert observation.splitlines()[0] == "Quilt Labs: Quilt Labs is a firm. It sits in Pelora."
    assert env.step(f"<answer>{records[0]['answer'].lower()}</answer>").reward == 1.0


def test_load_qa_file_accepts_a_data_wrapper_and_a_one_line_file(tmp_path):
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"version": "1", "data": [HOTPOT, TWOWIKI]}, indent=1))
    assert [r["extra_info"]["id"] for r in load_qa_file(wrapped)[0]] == ["h1", "w1"]
    one = write(tmp_path / "one.jsonl", [MUSIQUE], jsonl=True)
    rows, corpus = load_qa_file(one)
    assert len(rows) == 1 and corpus[0]["title"] == "Arlo Venn"


def test_load_qa_file_with_a_user_corpus_and_aliases(tmp_path):
    qa = write(tmp_path / "qa.jsonl", [{"question": "Where was Arlo Venn born?", "golden_answers": ["Pelora", "Pel."]},
                                       MUSIQUE], jsonl=True)
    corpus_file = write(tmp_path / "corpus.jsonl", [
        {"id": "7", "contents": '"Arlo Venn"\nArlo Venn was born in Pelora.'},  # Pyserini / FlashRAG layout
        {"id": "8", "title": "Pelora", "text": "Pelora is a city."}], jsonl=True)
    rows, corpus = load_qa_file(qa, corpus_file)
    assert corpus == [{"id": "7", "title": "Arlo Venn", "text": "Arlo Venn was born in Pelora."},
                      {"id": "8", "title": "Pelora", "text": "Pelora is a city."}], "context is ignored given a corpus"
    assert rows[1]["reward_model"]["ground_truth"] == ["Pelora", "Pelora City"]
    env = MultiHopEnv(BM25Index(corpus), search_k=1)
    env.reset(rows[1])
    assert env.step(call("search", query="Arlo Venn born")).observation == "Arlo Venn: Arlo Venn was born in Pelora."
    assert env.step("<answer>pelora city</answer>").reward == 1.0


@pytest.mark.parametrize("content,where,fields", [
    ('{"question": "q", "answer": "a"}\n{"question": "q2", "answer": \n', "line 2", "'question'"),
    ('{"question": "q", "answer": "a"}\n{"query": "q2", "answer": "a"}\n', "line 2", "'answer'"),
    ('[{"question": "q", "answer": "a"}, {"question": "q", "answer": []}]', "item 1", "'answers'"),
    ('[{"question": "q", "answer": "a"}, 3]', "item 1", "'question'"),
    ("", "no records", "'question'"),
])
def test_bad_qa_files_name_the_file_line_and_fields(tmp_path, content, where, fields):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError) as err:
        load_qa_file(path, corpus_path=path)
    assert str(path) in str(err.value) and where in str(err.value) and fields in str(err.value)


def test_bad_corpus_and_missing_corpus_raise(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": 1, "text": "ok"}\n{"id": 2, "body": "no text"}\n')
    with pytest.raises(ValueError, match=r"corpus\.jsonl: line 2: expected 'text'"):
        load_corpus(corpus)
    qa = write(tmp_path / "qa.json", [{"question": "q", "answer": "a"}], jsonl=False)
    with pytest.raises(ValueError, match="no corpus.*corpus_path"):
        load_qa_file(qa)


# -- state features for the success predictor

def expert_histories(domain, row):
    """The expert's prefixes as the tree serialises them: question, then each turn's action and observation."""
    from tracerl.core.history import History

    env, turns, parts = domain.make_env(), [], [row["prompt"][-1]["content"]]
    env.reset(row)
    histories = [History(parts[0], 0, prompt_id="multihop:train:0")]
    for depth in range(1, 9):
        action = domain.expert_turn(row, turns, np.random.default_rng(0))
        result = env.step(action)
        if result.done:
            return histories, result.reward
        turns.append((action, result.observation))
        parts += [action, result.observation]
        histories.append(History("\n".join(parts), depth, prompt_id="multihop:train:0", meta={"gold": "x"}))
    return histories, 0.0


@pytest.fixture(scope="module")
def gappy():
    return MultiHopDomain(num_entities=80, num_distractors=20, hops=(1, 4), search_k=1, missing_share=0.2,
                          unanswerable_share=0.5)


def test_state_features_replay_the_chain_from_the_transcript(gappy):
    from tracerl.io.domains.multihop import parse_question

    state_features = gappy.state_features
    rows = gappy.rows("train", 40, seed=3)
    for row in rows:
        info = row["extra_info"]
        assert parse_question(row["prompt"][-1]["content"]) == (info["start"], info["relations"])
        histories, reward = expert_histories(gappy, row)
        assert reward == float(info["answerable"])
        first = state_features(histories[0])
        assert first[f"hops={info['hops']}"] == 1 and first[f"remaining={info['hops']}"] == 1 and first["last=none"]
        if info["answerable"]:  # every search resolves a hop
            for depth, h in enumerate(histories[1:], 1):
                f = state_features(h)
                assert f[f"remaining={info['hops'] - depth}"] == 1 and f["last=advanced"] and f["wasted=0"], f
        else:  # the search for the entity without a document fails, and the features say so
            f = state_features(histories[-1])
            assert f["last=failed"] and "wasted=0" not in f and "remaining=0" not in f, f


def test_state_features_never_read_the_gold_answer(gappy):
    """The hook sees a History only; changing the row's gold answer and path leaves the transcript and features."""
    state_features = gappy.state_features
    for row in gappy.rows("train", 20, seed=4):
        forged = json.loads(json.dumps(row))
        forged["reward_model"]["ground_truth"] = "Nobody Atall"
        forged["extra_info"]["path"] = ["Nobody Atall"] * len(row["extra_info"]["path"])
        a, b = expert_histories(gappy, row)[0], expert_histories(gappy, forged)[0]
        assert [h.text for h in a] == [h.text for h in b]
        assert [state_features(h) for h in a] == [state_features(h) for h in b]
    from tracerl.core.history import History
    from tracerl.io.domains.math import MathDomain

    assert MathDomain().state_features(History("Who is the mentor of Arlo Venn?", 0, prompt_id="math:train:1")) \
        .get("hops=1") is None, "another domain's hook does not compute multihop's features"
