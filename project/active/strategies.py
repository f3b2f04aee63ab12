"""Which unlabeled samples to label next: one pass over the pool per round, in batches, with bounded memory.

A strategy sees the pool batch by batch (`update`) and then names `budget` keys (`select`), best first:

- random: a seeded uniform sample, the keys with the highest `tie_break(seed, round, key)`; it never needs probs.
- entropy: -sum p log p of the model's class probabilities.
- margin: 1 - (p_top1 - p_top2), so that higher means more uncertain (p_top2 = 0 with one class).
- least-confidence: 1 - p_top1.
- kcenter: k-center greedy (Sener & Savarese, "core-set") over the model's embeddings of a candidate set: the
  `candidates` keys with the highest tie_break (a uniform "priority" sample that does not depend on the order in
  which batches arrive), each pick the candidate farthest from its nearest center (labeled samples and picks).

Memory does not grow with the pool: the scored strategies keep the top `budget` items in a heap (O(budget)
items), kcenter keeps `candidates` items with their embedding rows (O(candidates x D) floats). Ties in score are
broken by `tie_break` and then by key, so a selection is the same for any split of the pool into batches, any
order of the batches, workers or ranks. The pool's keys are expected to be unique; a key offered again while it
is held is ignored, so no key is ever selected twice.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Callable
from dataclasses import dataclass

import torch

from project.errors import UserError

STRATEGIES = ("random", "entropy", "margin", "least-confidence", "kcenter")
FIRST_PICK = 1e30  # kcenter's score for a pick with no center yet (its distance is infinite)
CDIST_ELEMENTS = 1 << 24  # the most distances kcenter computes at once (64 MiB of float32)


@dataclass(frozen=True)
class Selected:
    """A key chosen for labeling. score: higher = more wanted; for kcenter the distance to the nearest center."""

    key: str
    url: str
    score: float


def tie_break(seed: int, round: int, key: str) -> float:
    """A uniform number in [0, 1) fixed by (seed, round, key), the same in every process (blake2b, not hash())."""
    digest = hashlib.blake2b(f"{seed}:{round}:{key}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> 11) / float(1 << 53)


def _unknown(name: str) -> UserError:
    return UserError(f"unknown active-learning strategy {name!r}; choose from: {', '.join(STRATEGIES)}")


def parse_strategies(text: str) -> list[str]:
    """ "entropy, random" -> ["entropy", "random"]; refuses empty, unknown and repeated names (UserError)."""
    names = [name.strip() for name in text.split(",")]
    seen: list[str] = []
    for name in names:
        if not name:
            raise UserError(f"empty active-learning strategy name in {text!r}; choose from: {', '.join(STRATEGIES)}")
        if name not in STRATEGIES:
            raise _unknown(name)
        if name in seen:
            raise UserError(f"active-learning strategy {name!r} is named twice in {text!r}")
        seen.append(name)
    return seen


class Strategy:
    """Keeps the best items seen so far in a min-heap of ((score, tie, key), url, extra); `capacity` bounds it."""

    name = ""
    needs_model = True
    needs_embeddings = False

    def __init__(self, budget: int, seed: int, round: int, candidates: int | None = None) -> None:
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ValueError(f"budget must be an integer >= 1, got {budget!r}")
        if candidates is not None and (not isinstance(candidates, int) or candidates < budget):
            raise ValueError(f"candidates must be an integer >= budget ({budget}), got {candidates!r}")
        self.budget, self.seed, self.round, self.candidates = budget, seed, round, candidates
        self.capacity = budget
        self._heap: list[tuple] = []
        self._held: set[str] = set()

    def tie(self, key: str) -> float:
        return tie_break(self.seed, self.round, key)

    def scores(self, probs: torch.Tensor) -> torch.Tensor:
        """Per-row scores of a [B, C] probability batch, float64, higher = more wanted."""
        raise NotImplementedError

    def update(
        self, keys: list[str], urls: list[str], probs: torch.Tensor | None, embeddings: torch.Tensor | None = None
    ) -> None:
        """Offer a batch of the pool: scores in one vectorized step, then a heap push per row."""
        _check_keys(keys, urls)
        for key, url, score in zip(keys, urls, self._values(keys, probs), strict=True):
            self._offer((score, self.tie(key), key), url)

    def _values(self, keys: list[str], probs: torch.Tensor | None) -> list[float]:
        if probs is None:
            raise ValueError(f"the {self.name} strategy needs class probabilities, got probs=None")
        _check_rows(probs, len(keys), "probs")
        return self.scores(probs).tolist()

    def _offer(self, rank: tuple, url: str, extra: Callable[[], object] | None = None) -> None:
        """Push an item whose rank ends with its key, unless it is held already or not good enough."""
        key = rank[-1]
        if key in self._held or (len(self._heap) >= self.capacity and rank <= self._heap[0][0]):
            return
        item = (rank, url, None if extra is None else extra())
        if len(self._heap) < self.capacity:
            heapq.heappush(self._heap, item)
        else:
            self._held.discard(heapq.heapreplace(self._heap, item)[0][-1])
        self._held.add(key)

    def select(self, labeled_embeddings: torch.Tensor | None = None) -> list[Selected]:
        """The best min(budget, items seen) items, best first; the held items stay (select may be called again)."""
        return [Selected(rank[-1], url, float(rank[0])) for rank, url, _ in sorted(self._heap, reverse=True)]


def _check_keys(keys: list[str], urls: list[str]) -> None:
    if len(keys) != len(urls):
        raise ValueError(f"{len(keys)} keys but {len(urls)} urls")


def _check_rows(rows: torch.Tensor, count: int | None, what: str) -> None:
    """A bug unless `rows` is a finite [count, >=1] matrix (any count when None)."""
    if rows.dim() != 2 or (count is not None and rows.shape[0] != count) or rows.shape[1] < 1:
        raise ValueError(f"{what} must be [{'N' if count is None else count}, >=1], got {list(rows.shape)}")
    if not bool(torch.isfinite(rows).all()):
        raise ValueError(f"{what} hold NaN or infinite values")


class Random(Strategy):
    """A seeded uniform sample of the pool: score = tie_break(seed, round, key)."""

    name, needs_model = "random", False

    def _values(self, keys: list[str], probs: torch.Tensor | None) -> list[float]:
        return [self.tie(key) for key in keys]  # probs are never looked at


class Entropy(Strategy):
    name = "entropy"

    def scores(self, probs: torch.Tensor) -> torch.Tensor:
        p = probs.detach().to(torch.float64)
        return -(p * p.clamp_min(1e-30).log()).sum(dim=1)


class Margin(Strategy):
    name = "margin"

    def scores(self, probs: torch.Tensor) -> torch.Tensor:
        p = probs.detach().to(torch.float64)
        if p.shape[1] == 1:
            return 1.0 - p[:, 0]
        top = p.topk(2, dim=1).values
        return 1.0 - (top[:, 0] - top[:, 1])


class LeastConfidence(Strategy):
    name = "least-confidence"

    def scores(self, probs: torch.Tensor) -> torch.Tensor:
        return 1.0 - probs.detach().to(torch.float64).max(dim=1).values


class KCenter(Strategy):
    """k-center greedy over a priority sample of `candidates` keys (default max(10 x budget, 1000))."""

    name, needs_embeddings = "kcenter", True

    def __init__(self, budget: int, seed: int, round: int, candidates: int | None = None) -> None:
        super().__init__(budget, seed, round, candidates)
        self.capacity = candidates if candidates is not None else max(10 * budget, 1000)
        self.dim: int | None = None

    def update(
        self, keys: list[str], urls: list[str], probs: torch.Tensor | None, embeddings: torch.Tensor | None = None
    ) -> None:
        """Offer a batch; keeps the embedding rows (float32, CPU, cloned) of the keys that enter the candidates."""
        if embeddings is None:
            raise ValueError("the kcenter strategy needs embeddings, got embeddings=None")
        _check_keys(keys, urls)
        _check_rows(embeddings, len(keys), "embeddings")
        if self.dim is not None and embeddings.shape[1] != self.dim:
            raise ValueError(f"embeddings of width {embeddings.shape[1]} after width {self.dim}")
        self.dim = embeddings.shape[1]
        rows = embeddings.detach().to("cpu", torch.float32)
        for i, (key, url) in enumerate(zip(keys, urls, strict=True)):
            self._offer((self.tie(key), key), url, lambda i=i: rows[i].clone())

    def select(self, labeled_embeddings: torch.Tensor | None = None) -> list[Selected]:
        """Greedy k-center: each pick is the candidate farthest from the labeled samples and the earlier picks."""
        items = sorted(self._heap, reverse=True)  # highest tie_break first: argmax's first index breaks ties
        if not items:
            return []
        points = torch.stack([row for _, _, row in items])
        nearest = torch.full((len(items),), float("inf"))
        if labeled_embeddings is not None and labeled_embeddings.numel() > 0:
            labeled = labeled_embeddings.detach().to("cpu", torch.float32)
            _check_rows(labeled, None, "labeled_embeddings")
            if labeled.shape[1] != points.shape[1]:
                raise ValueError(f"labeled_embeddings of width {labeled.shape[1]}, candidates of {points.shape[1]}")
            step = max(1, CDIST_ELEMENTS // len(items))
            for start in range(0, labeled.shape[0], step):
                chunk = torch.cdist(points, labeled[start : start + step]).min(dim=1).values
                nearest = torch.minimum(nearest, chunk)
        picked: list[Selected] = []
        for _ in range(min(self.budget, len(items))):
            index = int(torch.argmax(nearest))
            distance = float(nearest[index])
            (_, key), url, _ = items[index]
            picked.append(Selected(key, url, FIRST_PICK if distance == float("inf") else distance))
            nearest = torch.minimum(nearest, torch.cdist(points[index : index + 1], points)[0])
            nearest[index] = -1.0  # never picked again (a distance is never negative)
        return picked


_CLASSES = {cls.name: cls for cls in (Random, Entropy, Margin, LeastConfidence, KCenter)}


def make_strategy(name: str, budget: int, seed: int, round: int, candidates: int | None = None) -> Strategy:
    """The strategy called `name` (one of STRATEGIES; UserError otherwise)."""
    if name not in _CLASSES:
        raise _unknown(name)
    return _CLASSES[name](budget, seed, round, candidates)
