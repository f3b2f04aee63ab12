"""project.active.strategies: which keys of a streamed pool each strategy selects, deterministically and in
bounded memory."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from project.active.strategies import STRATEGIES, Selected, make_strategy, parse_strategies, tie_break
from project.errors import UserError

UNCERTAINTY = ("entropy", "margin", "least-confidence")
SCORED = ("random", *UNCERTAINTY)


def feed(strategy, keys, probs, embeddings=None, *, splits=(), order=None):
    """Give the rows to `strategy` in batches cut at `splits`, the batches in `order` (default: as cut)."""
    bounds = [0, *sorted(splits), len(keys)]
    batches = [slice(a, b) for a, b in zip(bounds, bounds[1:], strict=False)]
    for i in order if order is not None else range(len(batches)):
        part = batches[i]
        rows = None if embeddings is None else embeddings[part]
        strategy.update(keys[part], [f"url-{k}" for k in keys[part]], None if probs is None else probs[part], rows)
    return strategy


def pool(n: int, classes: int = 4, dim: int = 3, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    keys = [f"k{i:05d}" for i in range(n)]
    probs = torch.softmax(3 * torch.randn(n, classes, generator=generator), dim=1)
    return keys, probs, torch.randn(n, dim, generator=generator)


def brute_force(name: str, keys, probs, budget: int, seed: int, *, round: int = 0) -> list[tuple[str, float]]:
    """The top `budget` keys by (score, tie_break), by sorting everything."""
    p = probs.to(torch.float64)
    if name == "random":
        scores = [tie_break(seed, round, key) for key in keys]
    elif name == "entropy":
        scores = (-(p * p.clamp_min(1e-30).log()).sum(dim=1)).tolist()
    elif name == "margin":
        top = torch.cat([p, torch.zeros(len(keys), 1, dtype=torch.float64)], dim=1).topk(2, dim=1).values
        scores = (1.0 - (top[:, 0] - top[:, 1])).tolist()
    else:
        scores = (1.0 - p.max(dim=1).values).tolist()
    ranked = sorted(zip(scores, [tie_break(seed, round, k) for k in keys], keys, strict=True), reverse=True)
    return [(key, score) for score, _, key in ranked[:budget]]


@pytest.mark.parametrize("name", UNCERTAINTY)
def test_uncertainty_strategies_pick_the_most_uncertain_rows_best_first(name):
    rows = {
        "one-hot-a": [1.0, 0.0, 0.0, 0.0],
        "skewed": [0.7, 0.1, 0.1, 0.1],
        "uniform": [0.25, 0.25, 0.25, 0.25],
        "confident": [0.97, 0.01, 0.01, 0.01],
        "spread": [0.4, 0.3, 0.2, 0.1],
        "one-hot-b": [0.0, 0.0, 1.0, 0.0],
    }
    strategy = feed(make_strategy(name, 3, seed=0, round=0), list(rows), torch.tensor(list(rows.values())))
    picked = strategy.select()
    assert [s.key for s in picked] == ["uniform", "spread", "skewed"]
    assert picked[0] == Selected("uniform", "url-uniform", pytest.approx(picked[0].score))
    expected = {"entropy": 1.3862944, "margin": 1.0, "least-confidence": 0.75}[name]
    assert picked[0].score == pytest.approx(expected, rel=1e-6)
    assert picked[0].score > picked[1].score > picked[2].score


def test_margin_and_least_confidence_disagree_where_they_should():
    keys = ["close-call", "flat"]
    probs = torch.tensor([[0.50, 0.49, 0.01], [0.40, 0.30, 0.30]])  # margins 0.01 vs 0.10; top-1 0.5 vs 0.4
    assert [s.key for s in feed(make_strategy("margin", 1, 0, 0), keys, probs).select()] == ["close-call"]
    assert [s.key for s in feed(make_strategy("least-confidence", 1, 0, 0), keys, probs).select()] == ["flat"]


@pytest.mark.parametrize("name", STRATEGIES)
def test_selection_does_not_depend_on_batches_or_their_order(name):
    keys, probs, embeddings = pool(300)
    probs[100:140] = probs[0]  # exact ties in score, broken by tie_break
    embeddings[200:220] = embeddings[0]
    first = feed(make_strategy(name, 20, 7, 1, 50 if name == "kcenter" else None), keys, probs, embeddings).select()
    assert len(first) == 20
    shuffled = list(range(len(keys)))
    random.Random(3).shuffle(shuffled)
    keys2, probs2, embeddings2 = [keys[i] for i in shuffled], probs[shuffled], embeddings[shuffled]
    for splits, order in [((1, 2, 150, 151), None), ((33, 66, 200), (3, 1, 0, 2)), (range(1, 300), range(299, -1, -1))]:
        again = make_strategy(name, 20, 7, 1, 50 if name == "kcenter" else None)
        assert feed(again, keys2, probs2, embeddings2, splits=splits, order=order).select() == first
    other_seed = feed(make_strategy(name, 20, 8, 1, 50 if name == "kcenter" else None), keys, probs, embeddings)
    if name in ("random", "kcenter"):
        assert {s.key for s in other_seed.select()} != {s.key for s in first}


def test_random_differs_by_round_and_is_deterministic():
    keys = [f"k{i}" for i in range(500)]
    picks = {r: [s.key for s in feed(make_strategy("random", 30, 1, r), keys, None).select()] for r in (0, 1)}
    assert picks[0] != picks[1]
    assert picks[0] == [s.key for s in feed(make_strategy("random", 30, 1, 0), keys, None, splits=(7,)).select()]


@pytest.mark.parametrize("name", STRATEGIES)
def test_a_key_given_twice_is_never_selected_twice(name):
    keys, probs, embeddings = pool(40)
    keys[5] = keys[6] = "twin"  # the same key within one batch, with different rows
    twice = make_strategy(name, 40, 0, 0)
    feed(twice, keys, probs, embeddings)
    feed(twice, keys, probs, embeddings, splits=(10, 20))
    picked = [s.key for s in twice.select()]
    assert len(picked) == len(set(picked)) == 39
    assert set(picked) == set(keys)
    small = make_strategy(name, 10, 0, 0, 10 if name == "kcenter" else None)  # keys also leave the heap
    for splits in [(), (3, 9, 30), (20,)]:
        feed(small, keys, probs, embeddings, splits=splits)
    picked = [s.key for s in small.select()]
    assert len(picked) == len(set(picked)) == 10


def test_random_never_looks_at_probs_and_is_roughly_uniform():
    strategy = make_strategy("random", 100, 0, 0)
    assert not strategy.needs_model and not strategy.needs_embeddings
    keys = [f"sample-{i:04d}" for i in range(1000)]
    counts = [0] * 10
    for seed in range(10):
        for picked in feed(make_strategy("random", 100, seed, 0), keys, None, splits=(250, 500)).select():
            counts[int(picked.key.split("-")[1]) // 100] += 1
    assert sum(counts) == 1000
    assert all(50 <= count <= 150 for count in counts), counts


@pytest.mark.parametrize("name", SCORED)
def test_scored_strategies_hold_at_most_budget_items(name):
    strategy = make_strategy(name, 7, 0, 0)
    keys, probs, _ = pool(2000)
    for start in range(0, 2000, 100):
        strategy.update(keys[start : start + 100], keys[start : start + 100], probs[start : start + 100])
        assert len(strategy._heap) == len(strategy._held) == 7


def test_uncertainty_strategies_need_probs():
    with pytest.raises(ValueError, match="probs=None"):
        make_strategy("entropy", 1, 0, 0).update(["a"], ["u"], None)


def test_kcenter_picks_one_from_each_far_cluster():
    generator = torch.Generator().manual_seed(0)
    centers = torch.tensor([[200.0, 0.0, 0.0], [0.0, 100.0, 0.0], [0.0, 0.0, 100.0]])  # far0 is the farthest
    near = 0.5 * torch.randn(300, 3, generator=generator)
    far = torch.cat([c + 0.5 * torch.randn(10, 3, generator=generator) for c in centers])
    embeddings = torch.cat([near, far])
    keys = [f"near{i}" for i in range(300)] + [f"far{c}_{i}" for c in range(3) for i in range(10)]
    order = torch.randperm(len(keys), generator=generator).tolist()
    strategy = make_strategy("kcenter", 3, 0, 0)
    assert strategy.needs_embeddings and strategy.needs_model
    feed(strategy, [keys[i] for i in order], None, embeddings[order], splits=(64, 128, 256))
    picked = strategy.select(labeled_embeddings=torch.zeros(4, 3))
    assert sorted(s.key.split("_")[0] for s in picked) == ["far0", "far1", "far2"]
    assert picked[0].key.startswith("far0") and 190 < picked[0].score < 210
    assert all(90 < s.score < 110 for s in picked[1:])
    unlabeled = strategy.select()  # no labeled samples: the first pick has no center to be far from
    assert unlabeled[0].score == 1e30
    assert unlabeled[0].key == max(keys, key=lambda k: tie_break(0, 0, k))


def test_kcenter_never_picks_a_candidate_twice_and_chunks_the_labeled_distances(monkeypatch):
    keys = [f"same{i}" for i in range(10)]
    same = feed(make_strategy("kcenter", 4, 0, 0), keys, None, torch.ones(10, 2)).select()
    assert [s.key for s in same] == sorted(keys, key=lambda k: tie_break(0, 0, k), reverse=True)[:4]
    assert [s.score for s in same] == [1e30, 0.0, 0.0, 0.0]
    keys, _, embeddings = pool(100)
    labeled = torch.randn(37, 3, generator=torch.Generator().manual_seed(1))
    whole = feed(make_strategy("kcenter", 10, 0, 0), keys, None, embeddings).select(labeled)
    monkeypatch.setattr("project.active.strategies.CDIST_ELEMENTS", 250)  # 2 labeled rows at a time
    chunked = feed(make_strategy("kcenter", 10, 0, 0), keys, None, embeddings).select(labeled)
    assert [s.key for s in chunked] == [s.key for s in whole]  # cdist's float32 rounding may differ by chunk
    assert [s.score for s in chunked] == pytest.approx([s.score for s in whole], rel=1e-5)


def test_kcenter_holds_at_most_candidates_embeddings_and_refuses_none():
    strategy = make_strategy("kcenter", 5, 2, 0, candidates=50)
    keys, _, embeddings = pool(6400, dim=8)
    for start in range(0, 6400, 64):
        strategy.update(keys[start : start + 64], keys[start : start + 64], None, embeddings[start : start + 64])
        assert len(strategy._heap) <= 50 and len(strategy._held) == len(strategy._heap)
    assert len(strategy._heap) == 50
    assert {rank[-1] for rank, _, _ in strategy._heap} == set(sorted(keys, key=lambda k: tie_break(2, 0, k))[-50:])
    row = next(row for _, _, row in strategy._heap)
    assert row.dtype == torch.float32 and row.untyped_storage().nbytes() == 8 * 4  # a clone, not a view of a batch
    assert len(strategy.select()) == 5
    with pytest.raises(ValueError, match="embeddings"):
        strategy.update(["x"], ["u"], torch.ones(1, 2))


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(SCORED),
    values=st.lists(st.sampled_from([0.0, 0.1, 0.5, 1.0, 2.0]), max_size=160),  # few values: many exact ties
    classes=st.integers(1, 4),
    budget=st.integers(1, 12),
    seed=st.integers(0, 3),
    cuts=st.lists(st.integers(0, 40), max_size=5),
)
def test_selection_is_the_brute_force_top_budget(*, name, values, classes, budget, seed, cuts):
    n = len(values) // classes
    keys = [f"r{i}" for i in range(n)]
    weights = torch.tensor(values[: n * classes], dtype=torch.float32).reshape(n, classes) + 1e-3
    probs = weights / weights.sum(dim=1, keepdim=True)
    strategy = feed(make_strategy(name, budget, seed, 2), keys, probs, splits=[c for c in cuts if c <= len(keys)])
    picked = strategy.select()
    assert len(picked) == min(budget, len(keys))
    assert len({s.key for s in picked}) == len(picked) and {s.key for s in picked} <= set(keys)
    assert all(s.url == f"url-{s.key}" for s in picked)
    assert [(s.key, s.score) for s in picked] == brute_force(name, keys, probs, budget, seed, round=2)


def test_parse_strategies():
    assert parse_strategies("entropy,random") == ["entropy", "random"]
    assert parse_strategies(" kcenter , least-confidence,margin ") == ["kcenter", "least-confidence", "margin"]
    for text, bad in [
        ("entropy,bogus", "'bogus'"),
        ("entropy, entropy", "'entropy'"),
        ("", "empty"),
        ("margin,", "empty"),
    ]:
        with pytest.raises(UserError) as error:
            parse_strategies(text)
        message = str(error.value)
        assert bad in message and "\n" not in message
    with pytest.raises(UserError, match="'nope'.*random, entropy, margin, least-confidence, kcenter"):
        parse_strategies("nope")
    with pytest.raises(UserError, match="'Entropy'"):
        make_strategy("Entropy", 1, 0, 0)


def test_budget_and_candidates_are_checked():
    for budget, candidates in [(0, None), (5, 4), (-1, 10)]:
        with pytest.raises(ValueError):
            make_strategy("kcenter", budget, 0, 0, candidates)
    assert make_strategy("kcenter", 5, 0, 0).capacity == 1000
    assert make_strategy("kcenter", 500, 0, 0).capacity == 5000


def test_tie_break_is_uniform_and_the_same_in_every_process():
    assert tie_break(0, 0, "a") == 0.6075729429980676  # a fixed value: Python's hash() would change per process
    values = [tie_break(1, 2, f"key{i}") for i in range(2000)]
    assert all(0.0 <= v < 1.0 for v in values)
    assert 0.45 < sum(values) / len(values) < 0.55
    assert tie_break(1, 2, "key0") != tie_break(1, 3, "key0") != tie_break(2, 2, "key0")
