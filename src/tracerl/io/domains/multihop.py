"""Multi-hop question answering with a BM25 search tool: a generated world, its environment and expert.

`make_kb(num_entities, num_distractors, seed)` builds a small made-up world: people, cities, countries,
companies and universities with pronounceable names, linked by functional relations (born_in, works_for,
founded_by, capital, ...), and one short document per entity stating its facts ("Arlo Venn was born in
Pelora. Arlo Venn works for Quilt Systems."). Distractor entities with look-alike names ("Mira Venn",
"Quilt Labs", "Pelora Falls") carry facts about real entities, so a search returns near misses.

`MultiHopDomain` asks 1-6 hop questions along relation chains ("Who is the founder of the employer of
Arlo Venn?"); every relation is a function, so the answer is unique. One world serves every split and
each question goes to test, warmup (the warm start's questions, optional) or train by a hash of its chain,
so the splits never share a question but share every entity (a tiny model can only copy names it has seen
in training). Rows keep the same mix in every split: each row's hop count is drawn from `hop_mix`. With
`missing_share` > 0 some real entities have no document in the corpus, and `unanswerable_share` of the rows
are questions whose chain needs one of them: the search for it returns only near misses, which the
transcript shows, and no policy can answer. With `missing_kinds` every entity of a kind lacks its document (a
corpus without university pages), so the question's relations already tell that it cannot be answered.
`history_state` reads a prefix's text the way the expert tracks a chain (hops resolved, the last search
failed, ...) and gives the success predictor those as features.
`MultiHopEnv` gives the policy one tool, `search(query)`, and scores `<answer>` by normalised exact match.

`load_qa_file` reads HotpotQA / 2WikiMultiHopQA / MuSiQue / FlashRAG-style files and a user corpus into
the same rows, to run `MultiHopEnv(BM25Index(corpus))` on real data. Not here: dense retrieval, F1 or
LLM-judged rewards, an expert for real data.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Sequence

import numpy as np

from tracerl.core.history import History
from tracerl.io.domains.base import Domain, ToolEnv, make_row
from tracerl.io.domains.retrieval import BM25Index
from tracerl.io.env.actions import Tool
from tracerl.io.files import read_utf8
from tracerl.io.files.boundary import listing
from tracerl.io.files.rows import check_ids, check_row, non_finite


class Relation(NamedTuple):
    subject: str  # kind of entity the fact is about
    object: str  # kind of entity the fact points to
    sentence: str  # how a document states it, with {s} subject and {o} object
    phrase: str  # how a question names the object, with {x} the subject phrase
    query: str  # words the expert adds to the subject's name when it searches


RELATIONS = {
    "born_in": Relation("person", "city", "{s} was born in {o}.", "the birthplace of {x}", "born in"),
    "works_for": Relation("person", "company", "{s} works for {o}.", "the employer of {x}", "works for"),
    "studied_at": Relation("person", "university", "{s} studied at {o}.", "the alma mater of {x}", "studied at"),
    "mentor": Relation("person", "person", "{s} was mentored by {o}.", "the mentor of {x}", "mentored by"),
    "founded_by": Relation("company", "person", "{s} was founded by {o}.", "the founder of {x}", "founded by"),
    "headquartered_in": Relation("company", "city", "{s} is headquartered in {o}.", "the headquarters of {x}",
                                 "headquartered in"),
    "located_in": Relation("university", "city", "{s} is located in {o}.", "the home city of {x}", "located in"),
    "in_country": Relation("city", "country", "{s} is a city in {o}.", "the country of {x}", "city in"),
    "capital": Relation("country", "city", "{s} has its capital in {o}.", "the capital of {x}", "capital"),
    "leader": Relation("country", "person", "{s} is led by {o}.", "the leader of {x}", "led by"),
}
KIND_SHARES = {"person": 0.5, "company": 0.15, "university": 0.1, "country": 0.07}  # cities take the rest
ONSETS = "b d f g h k l m n p r s t v z br dr gr kr tr st sh th".split()
VOWELS = "a e i o u".split()
CODAS = ["", "", "", "n", "l", "r", "s", "m"]
COMPANY_SUFFIXES = ["Systems", "Labs", "Works", "Group", "Motors", "Foods"]
UNIVERSITY_SUFFIXES = ["University", "College", "Institute"]
CITY_SUFFIXES = ["Falls", "Heights", "Bay", "Springs"]


@dataclass(frozen=True)
class Entity:
    name: str  # unique; also the title of its document
    kind: str  # "person", "city", "country", "company" or "university"
    facts: dict[str, str]  # relation -> name of the object entity
    distractor: bool = False  # exists only to crowd search results; never on a question's chain


@dataclass(frozen=True)
class KnowledgeBase:
    entities: dict[str, Entity]  # by name
    documents: list[dict[str, str]]  # {"id", "title", "text"}, one per entity, in a seeded shuffled order


def make_kb(num_entities: int, num_distractors: int, seed: int) -> KnowledgeBase:
    """A seeded world: `num_entities` real entities with functional relations, plus look-alike distractors."""
    if num_entities < 20 or num_distractors < 0:
        raise ValueError(f"make_kb needs num_entities >= 20 and num_distractors >= 0, got {num_entities}, "
                         f"{num_distractors}")
    rng = np.random.default_rng([seed, 17])
    used: set[str] = set()

    def word(syllables: int) -> str:
        while True:
            w = "".join(rng.choice(ONSETS) + rng.choice(VOWELS) for _ in range(syllables)) + rng.choice(CODAS)
            if w not in used:
                used.add(w)
                return w.capitalize()

    counts = {kind: max(2, round(share * num_entities)) for kind, share in KIND_SHARES.items()}
    counts["city"] = num_entities - sum(counts.values())
    first_names = [word(2) for _ in range(max(2, counts["person"] // 3))]  # shared first names: near-miss hits
    names = {"person": [f"{rng.choice(first_names)} {word(2)}" for _ in range(counts["person"])],
             "company": [f"{word(2)} {rng.choice(COMPANY_SUFFIXES)}" for _ in range(counts["company"])],
             "university": [f"{word(2)} {rng.choice(UNIVERSITY_SUFFIXES)}" for _ in range(counts["university"])],
             "country": [word(2) + "ia" for _ in range(counts["country"])],
             "city": [word(3) for _ in range(counts["city"])]}
    country_of = {str(c): names["country"][i] if i < counts["country"] else str(rng.choice(names["country"]))
                  for i, c in enumerate(rng.permutation(names["city"]))}  # every country gets a city

    def pick(kind: str, avoid: str = "") -> str:
        return str(rng.choice([n for n in names[kind] if n != avoid]))

    def facts_of(kind: str, name: str) -> dict[str, str]:
        if kind == "city":
            return {"in_country": country_of[name]}
        if kind == "country":
            return {"capital": str(rng.choice(sorted(c for c, k in country_of.items() if k == name))),
                    "leader": pick("person")}
        return {rel: pick(r.object, avoid=name) for rel, r in RELATIONS.items() if r.subject == kind}

    entities = {n: Entity(n, kind, facts_of(kind, n)) for kind in names for n in names[kind]}
    for i in range(num_distractors):
        kind = ["person", "company", "city", "university"][i % 4]
        for _attempt in range(1000):
            twin = pick(kind).split()
            if kind == "person":
                name = f"{twin[0]} {word(2)}" if rng.random() < 0.5 else f"{rng.choice(first_names)} {twin[1]}"
            elif kind == "city":
                name = f"{twin[0]} {rng.choice(CITY_SUFFIXES)}"
            else:
                name = f"{twin[0]} {rng.choice(COMPANY_SUFFIXES if kind == 'company' else UNIVERSITY_SUFFIXES)}"
            if name not in entities:
                break
        else:
            raise ValueError(f"no unused look-alike name left for a distractor {kind}; lower num_distractors "
                             f"({num_distractors}) or raise num_entities ({num_entities})")
        facts = {rel: pick(r.object) for rel, r in RELATIONS.items() if r.subject == kind}
        entities[name] = Entity(name, kind, facts, distractor=True)
    documents = []
    for d, e in enumerate(rng.permutation(sorted(entities))):
        rels = rng.permutation(sorted(entities[e].facts))
        text = " ".join(RELATIONS[r].sentence.format(s=e, o=entities[e].facts[r]) for r in rels)
        documents.append({"id": f"d{d}", "title": str(e), "text": text})
    return KnowledgeBase(entities, documents)


@dataclass(frozen=True)
class Question:
    start: str  # the entity the question names
    relations: tuple[str, ...]  # the chain, applied from the start outwards
    path: tuple[str, ...]  # entities reached after each hop; the last is the answer

    @property
    def text(self) -> str:
        phrase = self.start
        for rel in self.relations:
            phrase = RELATIONS[rel].phrase.format(x=phrase)
        return f"{'Who' if RELATIONS[self.relations[-1]].object == 'person' else 'What'} is {phrase}?"

    def in_test(self, test_fraction: float) -> bool:
        """Whether the question is held out: a stable hash of its chain falls below `test_fraction`."""
        digest = hashlib.blake2b(f"{self.start}|{'/'.join(self.relations)}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64 < test_fraction


def all_questions(kb: KnowledgeBase, min_hops: int, max_hops: int) -> list[Question]:
    """Every chain of min_hops..max_hops relations from a real entity through distinct entities."""
    found: list[Question] = []

    def walk(start: str, rels: tuple[str, ...], path: tuple[str, ...]) -> None:
        if len(rels) >= min_hops:
            found.append(Question(start, rels, path))
        if len(rels) == max_hops:
            return
        for rel, obj in sorted(kb.entities[path[-1] if path else start].facts.items()):
            if obj != start and obj not in path:
                walk(start, rels + (rel,), path + (obj,))

    for name in sorted(n for n, e in kb.entities.items() if not e.distractor):
        walk(name, (), ())
    return found


def normalize_answer(text: str) -> str:
    """SQuAD / HotpotQA normalisation: lowercase, drop punctuation and articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


_PUNCTUATION = frozenset(string.punctuation)


def exact_match(prediction: str, ground_truth: str | Sequence[str]) -> float:
    """1.0 if the normalised prediction equals a normalised ground truth (any alias of a list), else 0.0.

    An answer that normalises to nothing never matches, nor does a NaN or infinite ground truth."""
    truths = [ground_truth] if isinstance(ground_truth, str) else list(ground_truth)
    pred = normalize_answer(prediction)
    return float(bool(pred) and any(pred == normalize_answer(str(t)) for t in truths if not non_finite(t)))


def read_fact(observation: str, subject: str, relation: str) -> str | None:
    """The object of `relation` as stated in the search result titled `subject`, or None if not shown."""
    prefix = RELATIONS[relation].sentence.split("{o}")[0].format(s=subject)
    for line in observation.splitlines():
        if line.startswith(f"{subject}: "):
            body = line[len(subject) + 2:]
            for sentence in re.split(r"(?<=\.) ", body):
                if sentence.startswith(prefix) and sentence.endswith("."):
                    return sentence[len(prefix):-1]
    return None


class MultiHopEnv(ToolEnv):
    """One tool, `search(query)`: the top `search_k` documents, one per line as 'title: text'.

    State: the queries so far (for metrics); results depend only on the query, so restore is exact."""

    def __init__(self, index: BM25Index, search_k: int = 3, max_doc_chars: int = 400, max_query_chars: int = 300):
        super().__init__()
        self.index, self.search_k = index, search_k
        self.max_doc_chars, self.max_query_chars = max_doc_chars, max_query_chars
        self._tools = {"search": Tool(
            "search", "Search the documents. Returns the best matches, one per line as 'title: text'.",
            {"type": "object", "properties": {"query": {"type": "string", "description": "keywords, e.g. a name"}},
             "required": ["query"]}, self._search)}

    def initial_state(self, row: dict[str, Any]) -> dict[str, Any]:
        return {"queries": []}

    def tool_table(self) -> dict[str, Tool]:
        return self._tools

    def score(self, answer: str) -> float:
        return exact_match(answer, self.row["reward_model"]["ground_truth"])

    def _search(self, query: str) -> str:
        query = " ".join(query.split())[: self.max_query_chars]
        if not query:
            raise ValueError("empty query; search for keywords such as an entity name")
        self.state["queries"].append(query)
        lines = []
        for doc in self.index.search(query, self.search_k):
            line = " ".join(f"{doc.get('title', '')}: {doc['text']}".split())
            lines.append(line if len(line) <= self.max_doc_chars else line[: self.max_doc_chars - 3] + "...")
        return "\n".join(lines) or "no documents found"


QUERY_FORMS = ("{name} {words}", "{name}")  # the expert's first query for a hop, then its retry


@dataclass(eq=False)
class MultiHopDomain(Domain):
    """Generated multi-hop QA; every option changes the world or the questions, so fix them per experiment."""

    num_entities: int = 150  # real entities (people, cities, countries, companies, universities)
    num_distractors: int = 60  # look-alike entities that crowd search results but never sit on a chain
    hops: tuple[int, int] = (2, 4)  # inclusive range of relations per question
    seed: int = 0  # seed of the world; the same seed gives the same documents and question pool
    search_k: int = 3  # documents per search; fewer makes the task harder
    max_doc_chars: int = 400  # each search result is cut to this many characters
    test_fraction: float = 0.2  # share of question chains held out for the test split
    warmup_fraction: float = 0.0  # share of chains kept for the "warmup" split (0 = "warmup" is "train")
    hop_mix: tuple[float, ...] = ()  # weight of each hop count low..high in every split's rows (() = uniform)
    # weight of each hop count in the "warmup" split's rows only (() = hop_mix): a warm start that rarely sees long
    # chains leaves prompts that fail at first but that RL can learn (configs/trace-headroom.toml)
    warmup_hop_mix: tuple[float, ...] = ()
    missing_share: float = 0.0  # share of real entities whose document is left out of the corpus, drawn at random
    missing_kinds: tuple[str, ...] = ()  # kinds of entity with no document at all, e.g. ("university",)
    unanswerable_share: float = 0.0  # share of rows whose chain needs a missing document (needs missing_share > 0)
    kb: KnowledgeBase = field(init=False, repr=False)
    index: BM25Index = field(init=False, repr=False)
    missing: frozenset[str] = field(init=False, repr=False)  # entities without a document
    _pool: dict[str, dict[tuple[int, bool], list[Question]]] | None = field(default=None, init=False, repr=False)

    name = "multihop"

    def state_features(self, history: History) -> dict[str, float]:
        """What the predictor reads of a history's state (`history_state`)."""
        return history_state(history)

    def __post_init__(self) -> None:
        lo, hi = self.hops
        if not 1 <= lo <= hi <= 6:
            raise ValueError(f"hops={self.hops} must satisfy 1 <= low <= high <= 6; e.g. hops=(2, 4)")
        if not 0 < self.test_fraction < 1:
            raise ValueError(f"test_fraction={self.test_fraction} must be in (0, 1)")
        if self.search_k < 1:
            raise ValueError(f"search_k={self.search_k} must be >= 1")
        if not 0 <= self.warmup_fraction < 1 - self.test_fraction:
            raise ValueError(f"warmup_fraction={self.warmup_fraction} must be in [0, 1 - test_fraction="
                             f"{1 - self.test_fraction:g}) so that training questions remain")
        for name, mix in (("hop_mix", self.hop_mix), ("warmup_hop_mix", self.warmup_hop_mix)):
            if mix and (len(mix) != hi - lo + 1 or min(mix) < 0 or sum(mix) <= 0):
                raise ValueError(f"{name}={mix} needs one weight >= 0 per hop count {lo}..{hi} "
                                 f"({hi - lo + 1} weights, not all 0), or () for uniform")
        if not 0 <= self.missing_share < 0.5 or not 0 <= self.unanswerable_share < 1:
            raise ValueError(f"missing_share={self.missing_share} must be in [0, 0.5) and unanswerable_share="
                             f"{self.unanswerable_share} in [0, 1)")
        kinds = {r.subject for r in RELATIONS.values()}
        if not set(self.missing_kinds) <= kinds:
            raise ValueError(f"missing_kinds has unknown kind(s) {listing(set(self.missing_kinds) - kinds)}; use some "
                             f"of {sorted(kinds)}")
        if self.unanswerable_share > 0 and self.missing_share == 0 and not self.missing_kinds:
            raise ValueError(f"unanswerable_share={self.unanswerable_share} needs missing_share > 0 or missing_kinds "
                             "(a question is unanswerable when a document on its chain is missing)")
        self.kb = make_kb(self.num_entities, self.num_distractors, self.seed)
        real = sorted(n for n, e in self.kb.entities.items() if not e.distractor)
        rng = np.random.default_rng([self.seed, 23])
        drawn = {real[i] for i in rng.permutation(len(real))[: round(self.missing_share * len(real))]}
        self.missing = frozenset(drawn | {n for n in real if self.kb.entities[n].kind in self.missing_kinds})
        self.index = BM25Index([d for d in self.kb.documents if d["title"] not in self.missing])

    def answerable(self, q: Question) -> bool:
        """Whether every document the chain must read (the start's and each inner entity's) is in the corpus."""
        return not self.missing.intersection((q.start,) + q.path[:-1])

    def _split_of(self, q: Question) -> str:
        digest = hashlib.blake2b(f"{q.start}|{'/'.join(q.relations)}".encode(), digest_size=8).digest()
        u = int.from_bytes(digest, "big") / 2**64  # the same hash as `Question.in_test`
        return "test" if u < self.test_fraction else "warmup" if u < self.test_fraction + self.warmup_fraction \
            else "train"

    def _strata(self, split: str) -> dict[tuple[int, bool], list[Question]]:
        if split not in ("train", "test", "warmup"):
            raise ValueError(f"split={split!r}; expected 'train', 'test' or 'warmup'")
        if split == "warmup" and self.warmup_fraction == 0:
            split = "train"  # no questions kept apart: the warm start shares the training questions
        if self._pool is None:
            self._pool = {"train": {}, "test": {}, "warmup": {}}
            for q in all_questions(self.kb, *self.hops):
                self._pool[self._split_of(q)].setdefault((len(q.relations), self.answerable(q)), []).append(q)
        return self._pool[split]

    def questions(self, split: str) -> dict[int, list[Question]]:
        """The split's question pool by hop count (built once; a question is in exactly one split)."""
        by_hops: dict[int, list[Question]] = {}
        for (hops, _), qs in sorted(self._strata(split).items()):
            by_hops.setdefault(hops, []).extend(qs)
        return by_hops

    def rows(self, split: str, num: int, seed: int = 0) -> list[dict[str, Any]]:
        """`num` questions in the domain's mix: each row's hop count is drawn from `hop_mix` (`warmup_hop_mix` for the
        "warmup" split when set), and it is unanswerable
        with probability `unanswerable_share`; within a stratum questions come in a seeded shuffled order, distinct
        until the stratum runs out, then reshuffled (so every split keeps the same mix whatever `num` is)."""
        strata = self._strata(split)
        rng = np.random.default_rng([self.seed, seed, {"train": 0, "test": 1, "warmup": 2}[split]])
        lo, hi = self.hops
        weights = self.warmup_hop_mix if split == "warmup" and self.warmup_hop_mix else self.hop_mix
        mix = np.asarray(weights or [1.0] * (hi - lo + 1), dtype=float)
        hop_of = lo + rng.choice(hi - lo + 1, size=num, p=mix / mix.sum())
        open_of = rng.random(num) >= self.unanswerable_share
        decks: dict[tuple[int, bool], list[Question]] = {}
        rows = []
        for i in range(num):
            key = (int(hop_of[i]), bool(open_of[i]))
            if not strata.get(key):
                raise ValueError(f"{split} has no {key[0]}-hop {'answerable' if key[1] else 'unanswerable'} "
                                 f"questions; raise num_entities (now {self.num_entities}) or missing_share (now "
                                 f"{self.missing_share}), or change hops/hop_mix")
            if not decks.get(key):
                decks[key] = [strata[key][j] for j in rng.permutation(len(strata[key]))]
            q = decks[key].pop()
            rows.append(make_row(self.name, q.text, q.path[-1], split=split, index=i, start=q.start,
                                 relations=list(q.relations), path=list(q.path), hops=len(q.relations),
                                 answerable=key[1]))
        return rows

    def make_env(self) -> MultiHopEnv:
        return MultiHopEnv(self.index, self.search_k, self.max_doc_chars)

    def expert_turn(self, row: dict[str, Any], turns: Sequence[tuple[str, str]], rng: np.random.Generator) -> str:
        """Search `name + relation words` for each hop, read the next name from that entity's result, answer.

        It never looks at the answer or path: only the start, the relation chain and the observations.
        After a miss it retries with the bare name; after a second miss it answers what it has (wrongly).
        Deterministic: `rng` is accepted for the Domain signature and unused."""
        entity, relations = row["extra_info"]["start"], row["extra_info"]["relations"]
        hop = misses = 0
        for _action, observation in turns:
            found = read_fact(observation, entity, relations[hop]) if hop < len(relations) else None
            entity, hop, misses = (found, hop + 1, 0) if found else (entity, hop, misses + 1)
        if hop == len(relations) or misses >= len(QUERY_FORMS):
            return f"The answer is {entity}.\n<answer>{entity}</answer>"
        rel = RELATIONS[relations[hop]]
        query = QUERY_FORMS[misses].format(name=entity, words=rel.query)
        call = json.dumps({"name": "search", "arguments": {"query": query}})
        return f"I need {rel.phrase.format(x=entity)}.\n<tool_call>{call}</tool_call>"


# -- state features for the success predictor ---------------------------------------------------

_PHRASE_PREFIXES = [(rel, r.phrase.format(x="")) for rel, r in RELATIONS.items()]  # "the founder of "


def parse_question(text: str) -> tuple[str, list[str]] | None:
    """(start entity, relation chain) of a generated question, or None if the text is not one."""
    for head in ("Who is ", "What is "):
        if text.startswith(head) and text.endswith("?"):
            rest, outer_first = text[len(head):-1], []
            while True:
                rel = next((r for r, prefix in _PHRASE_PREFIXES if rest.startswith(prefix)), None)
                if rel is None:
                    break
                outer_first.append(rel)
                rest = rest[len(RELATIONS[rel].phrase.format(x="")):]
            return (rest, outer_first[::-1]) if outer_first and rest else None
    return None


def history_state(history: History) -> dict[str, float]:
    """What a prefix shows about its chain, read from its text the way the expert tracks it, as one-hot features.

    The question line gives the start entity and the relations; each later line that is the current entity's
    search result stating the next relation resolves a hop. Features: hops in the question, hops remaining,
    turns that resolved nothing (capped at 3), whether the last search resolved a hop or failed, whether the last
    search result names the entity the chain needs next, remaining x turns taken (so the predictor can learn
    the turn cap), and the kinds of entity whose documents the chain must read (start and inner entities).
    Reads the history's text and depth only: never the gold answer or the environment's state."""
    lines = history.text.split("\n")
    parsed = parse_question(lines[0].strip())
    if parsed is None:
        return {}
    entity, relations = parsed
    hop, last, last_lines = 0, "none", []
    for line in lines[1:]:
        if "<tool_call>" in line:
            last, last_lines = "failed", []
            continue
        last_lines.append(line)
        found = read_fact(line, entity, relations[hop]) if hop < len(relations) else None
        if found:
            entity, hop, last = found, hop + 1, "advanced"
    remaining, depth = len(relations) - hop, history.depth
    named = any(entity in line for line in last_lines)
    kinds = {f"reads_kind={RELATIONS[relations[0]].subject}": 1.0}  # whose documents the chain must read
    kinds.update({f"reads_kind={RELATIONS[rel].object}": 1.0 for rel in relations[:-1]})
    return {**kinds, f"hops={len(relations)}": 1.0, f"remaining={remaining}": 1.0,
            f"wasted={min(max(depth - hop, 0), 3)}": 1.0, f"last={last}": 1.0,
            f"last_names_needed={named}": 1.0, f"remaining={remaining},depth={min(depth, 8)}": 1.0}




# -- real data -------------------------------------------------------------------------------------

QA_FIELDS = "'question' and 'answer' (string or list), 'answers', 'golden_answers' or 'answer_aliases'"
CORPUS_FIELDS = "'text' (with 'id', 'title') or 'contents' (with 'title', or a first line holding the title)"


def _records(path: Path, expected: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(location, object) for each record of a JSON array, a {"data": [...]} object or a JSONL file."""
    text = read_utf8(path)  # a file that is not UTF-8: the error names the byte and the fix
    whole: Any = None
    if text.lstrip()[:1] in ("[", "{"):
        try:
            whole = json.loads(text)
        except json.JSONDecodeError as err:
            if text.lstrip()[:1] == "[":
                raise ValueError(f"{path}: line {err.lineno}: invalid JSON ({err.msg}); expected a list of "
                                 f"objects with {expected}") from None
        except RecursionError:
            raise ValueError(f"{path}: nested deeper than Python's JSON parser reads; expected JSON or JSONL "
                             f"objects with {expected}") from None
    if isinstance(whole, dict) and isinstance(whole.get("data"), list):
        whole = whole["data"]
    if isinstance(whole, list):
        items = [(f"item {i}", r) for i, r in enumerate(whole)]
    elif isinstance(whole, dict) and "\n" in text.strip():  # one pretty-printed object; one line is JSONL
        items = [("item 0", whole)]
    else:
        items = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    items.append((f"line {n}", json.loads(line)))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}: line {n}: invalid JSON ({err.msg}); expected one object per line "
                                     f"with {expected}") from None
                except RecursionError:
                    raise ValueError(f"{path}: line {n}: nested deeper than Python's JSON parser reads; expected "
                                     f"one object per line with {expected}") from None
    if not items:
        raise ValueError(f"{path}: no records; expected JSON or JSONL objects with {expected}")
    for where, record in items:
        if not isinstance(record, dict):
            raise ValueError(f"{path}: {where}: expected an object with {expected}, got {type(record).__name__}")
        yield where, record


def load_corpus(path: str | Path) -> list[dict[str, str]]:
    """Documents {"id", "title", "text"} from a JSONL (or JSON) corpus of {"id","title","text"} or {"contents"}."""
    path, corpus = Path(path), []
    for where, r in _records(path, CORPUS_FIELDS):
        text = r.get("text", r.get("contents"))
        title = r.get("title")
        if not isinstance(text, str) or not isinstance(title, (str, type(None))):
            raise ValueError(f"{path}: {where}: expected {CORPUS_FIELDS}; got keys {sorted(r)[:8]}")
        if title is None and "text" not in r and "\n" in text:  # Pyserini/FlashRAG: '"Title"\nbody'
            title, text = text.split("\n", 1)
            title = title.strip().strip('"')
        corpus.append({"id": str(r.get("id", r.get("_id", len(corpus)))), "title": title or "", "text": text})
    return corpus


def _answers(record: dict[str, Any]) -> list[str]:
    found: list[str] = []
    for key in ("answer", "answers", "golden_answers", "answer_aliases"):
        value = record.get(key)
        for a in [value] if isinstance(value, str) else value if isinstance(value, list) else []:
            if isinstance(a, str) and a.strip() and a not in found:
                found.append(a)
    return found


def _context_docs(record: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(title, text) of a HotpotQA / 2Wiki `context` ([title, sentences]) or MuSiQue `paragraphs`."""
    for item in record.get("context") or []:
        if isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str):
            sentences = item[1] if isinstance(item[1], list) else [item[1]]
            yield item[0], " ".join(" ".join(str(s).split()) for s in sentences)
    for p in record.get("paragraphs") or []:
        if isinstance(p, dict) and isinstance(p.get("paragraph_text"), str):
            yield str(p.get("title", "")), p["paragraph_text"]


def load_qa_file(path: str | Path, corpus_path: str | Path | None = None, *, split: str = "test",
                 data_source: str = "multihop") -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """(rows, corpus) from a QA file; ground truth is the list of accepted answers (answer first).

    The corpus is `corpus_path` when given, else the union of the records' context paragraphs."""
    path, rows, wheres, seen, corpus = Path(path), [], [], set(), []
    for where, r in _records(path, QA_FIELDS):
        question, answers = r.get("question"), _answers(r)
        if not isinstance(question, str) or not question.strip() or not answers:
            raise ValueError(f"{path}: {where}: expected {QA_FIELDS}; got keys {sorted(r)[:8]}")
        own = r.get("_id", r.get("id"))  # the dataset's id where the record has one (never made up: a made-up
        # position could equal another record's own id, and two rows sharing an id are refused below)
        rows.append(make_row(data_source, question.strip(), answers, split=split, index=len(rows),
                             **({} if own is None else {"id": str(own)}), source=str(path)))
        wheres.append(f"{path}: {where}")
        check_row(rows[-1], wheres[-1])
        for title, text in [] if corpus_path is not None else _context_docs(r):
            if (title, text) not in seen:
                seen.add((title, text))
                corpus.append({"id": f"c{len(corpus)}", "title": title, "text": text})
    check_ids(rows, wheres)  # a question id twice: the file repeats a record
    if corpus_path is not None:
        corpus = load_corpus(corpus_path)
    if not corpus:
        raise ValueError(f"{path}: no corpus: records carry no 'context' or 'paragraphs'; pass corpus_path= a "
                         f"JSONL with {CORPUS_FIELDS}")
    return rows, corpus
