"""How one epoch is cut into batches: the plan every data source follows.

Every source, in memory or streamed, turns the same few numbers (batch size, shuffling, seed,
epoch, the batch to resume at, this process's rank among ``world_size``, whether a short last
batch is dropped) into its batches. Keeping that arithmetic here, once, is what makes the order
of an epoch the same function of (seed, epoch, batch index) for every source: resuming mid-epoch
and splitting the global batch among ranks then mean the same thing everywhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

# Mixes seed and epoch into one generator seed; a prime well above any epoch count, so that
# (seed, epoch) pairs of a run do not collide. Changing it changes every shuffled order.
_EPOCH_SEED_STRIDE = 1_000_003


def batch_choice(seed: int, epoch: int, batch: int, choices: int) -> int:
    """Which of ``choices`` options batch ``batch`` of ``epoch`` takes (a NaFlex batch's patch
    budget and, with it, its size): a pure function of its arguments (a 64-bit mix of them), so
    a resumed epoch and every rank draw the same.

    Args:
        seed: the run's seed.
        epoch: the epoch, from 0.
        batch: the global batch's index in the epoch, from 0.
        choices: how many options there are (at least 1).

    Returns:
        An index in ``0..choices - 1``.
    """
    if choices <= 1:
        return 0
    x = (seed * _EPOCH_SEED_STRIDE + epoch) * 0x9E3779B97F4A7C15 + batch + 1
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):  # splitmix64's finaliser
        x = ((x ^ (x >> shift)) * mult) & 0xFFFFFFFFFFFFFFFF
    return (x ^ (x >> 31)) % choices


def epoch_order(n: int, shuffle: bool, seed: int, epoch: int) -> torch.Tensor:
    """The order of ``n`` samples (int64 indices) in an epoch: identity, or a permutation of (seed, epoch).

    A pure function of its arguments, so an epoch can be replayed (resumed) from them alone.

    Args:
        n: the number of samples.
        shuffle: whether to permute them.
        seed: the run's seed.
        epoch: the epoch (from 0); with ``seed``, it seeds the permutation.

    Returns:
        ``arange(n)`` without shuffling, else a permutation of it, int64 (n,).
    """
    if not shuffle:
        return torch.arange(n)
    g = torch.Generator().manual_seed(seed * _EPOCH_SEED_STRIDE + epoch)
    return torch.randperm(n, generator=g)


@dataclass(frozen=True)
class BatchPlan:
    """The batches of one epoch, for one rank: what :meth:`Dataset.batches` is asked for.

    ``batch_size`` is the global batch: with ``world_size > 1`` each rank gets a disjoint
    1/world_size of every batch (positions ``rank, rank + world_size, ...`` of it), so the
    global batch equals a one-process run's. ``start_batch`` skips that many batches of the
    epoch (resuming mid-epoch). ``drop_last`` leaves out a short last batch. ``repeats`` takes
    each item that many times in a row (repeated augmentation), the epoch keeping its length.
    ``sizes``, where given, replaces ``batch_size``: each global batch takes one of these sizes,
    the one :func:`batch_choice` draws for it (batches of a token budget: fewer images where
    each has more patches).

    Attributes:
        batch_size: the global batch's images.
        shuffle: shuffle the epoch's order (:func:`epoch_order`).
        seed: the run's seed of the shuffle.
        epoch: the epoch, from 0; with ``seed`` it seeds the shuffle.
        start_batch: the epoch's batches to skip (resuming mid-epoch).
        rank: this process's rank, from 0.
        world_size: the processes sharing each batch.
        drop_last: leave out a short last batch.
        repeats: how many times in a row each item is taken.
        sizes: the global batch sizes batches draw from; empty: every batch ``batch_size``.

    Raises:
        ValueError: on creation, a ``batch_size``, a size or ``repeats`` below 1, a negative
            ``start_batch``, or a ``rank`` outside ``0..world_size - 1``.
    """

    batch_size: int
    shuffle: bool = False
    seed: int = 0
    epoch: int = 0
    start_batch: int = 0
    rank: int = 0
    world_size: int = 1
    drop_last: bool = False
    repeats: int = 1
    sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if any(s < 1 for s in self.sizes):
            raise ValueError(f"batch sizes must be at least 1, got {list(self.sizes)}")
        if len(set(self.sizes)) == 1:  # one size: the fixed arithmetic, the same batches
            object.__setattr__(self, "batch_size", self.sizes[0])
            object.__setattr__(self, "sizes", ())
        if self.repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {self.repeats}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        if self.start_batch < 0:
            raise ValueError(f"start_batch must be >= 0, got {self.start_batch}")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in 0..{self.world_size - 1}")

    def order(self, n: int) -> torch.Tensor:
        """The epoch's order of ``n`` items (see :func:`epoch_order`), with its repeats.

        Args:
            n: the number of items in the source.

        Returns:
            int64 indices (n,): the epoch's order; with ``repeats`` above 1, the first
            ``ceil(n / repeats)`` of it, each ``repeats`` times in a row, cut to ``n``.
        """
        order = epoch_order(n, self.shuffle, self.seed, self.epoch)
        if self.repeats == 1:
            return order
        distinct = -(-n // self.repeats)
        return order[:distinct].repeat_interleave(self.repeats)[:n]

    def num_batches(self, n: int) -> int:
        """Global batches in an epoch of ``n`` items, counting those before ``start_batch``.

        Args:
            n: the number of items in the epoch.

        Returns:
            ``n // batch_size``, plus one for a short last batch unless ``drop_last`` (with
            ``sizes``: the batches their drawn sizes cut ``n`` into, so counted).
        """
        if self.sizes:
            return len(self._spans(n))
        full, rest = divmod(n, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def _spans(self, n: int) -> list[tuple[int, int]]:
        """(start, end) in the epoch's order of each global batch, for drawn sizes."""
        spans, start, batch = [], 0, 0
        while start < n:
            end = start + self.sizes[batch_choice(self.seed, self.epoch, batch, len(self.sizes))]
            if end > n and self.drop_last:
                break
            spans.append((start, min(end, n)))
            start, batch = end, batch + 1
        return spans

    def _share(self, batch: int, n: int, spans: list[tuple[int, int]] | None = None) -> slice:
        """This rank's positions, in the epoch's order, of global batch ``batch``."""
        if spans is not None:
            start, end = spans[batch]
            return slice(start + self.rank, end, self.world_size)
        start = batch * self.batch_size
        return slice(start + self.rank, min(start + self.batch_size, n), self.world_size)

    def index_batches(self, n: int) -> Iterator[torch.Tensor]:
        """This rank's indices (int64) into ``n`` items, one tensor a batch, from ``start_batch`` on.

        For sources that can read any item directly (in memory, files in a folder). A batch in
        which this rank has no item (a short last batch) is left out.

        Args:
            n: the number of items in the source.

        Yields:
            int64 indices into the source, this rank's share of each global batch in turn.
        """
        order = self.order(n)
        spans = self._spans(n) if self.sizes else None
        for batch in range(self.start_batch, self.num_batches(n) if spans is None else len(spans)):
            local = order[self._share(batch, n, spans)]
            if len(local):
                yield local

    def local_sizes(self, n: int) -> list[int]:
        """How many items this rank takes from each global batch of the epoch, from batch 0.

        For streaming sources, which cannot index: they read their stream in these sizes, past
        the first ``start_batch`` without decoding. Every rank gets the same number of entries.

        Args:
            n: the number of items in the epoch.

        Returns:
            One count for each of the :meth:`num_batches` global batches; a rank may have 0
            in a short last batch.
        """
        spans = self._spans(n) if self.sizes else None
        count = self.num_batches(n) if spans is None else len(spans)
        return [len(range(n)[self._share(batch, n, spans)]) for batch in range(count)]


__all__ = ["BatchPlan", "batch_choice", "epoch_order"]
