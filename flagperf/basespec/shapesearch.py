"""Max-achievable GEMM: search (M, N, K) shapes on a grid for the fastest one, within a time budget.

The same idea as the "maximum achievable matmul FLOPS" searches published for accelerators: a chip's
datasheet peak is reached, if ever, at shapes whose tiles fill every compute unit in whole waves, and
which shape that is differs per chip and library version. An exhaustive grid is far too large (a 1k-16k
range at step 256 has 226,981 shapes), so the search is:

1. explore: a coarse lattice (a few values per axis, the fixed-shape case included) in a seeded random
   order, until it is done or half the budget is spent;
2. refine: a pattern search from the best shape so far, moving one axis at a time by a stride that
   halves down to the grid step whenever no neighbour is faster; it stops when the finest stride finds
   nothing faster or the budget is spent.

Pure logic: the rate of a shape comes from a callable, so the search is tested without a device.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

AXES = ("m", "n", "k")
LATTICE_POINTS = 4  # values per axis in the explore phase: 4^3 = 64 shapes


@dataclass(frozen=True, order=True)
class Shape:
    m: int
    n: int
    k: int

    def as_dict(self) -> dict[str, int]:
        return {"m": self.m, "n": self.n, "k": self.k}

    def __str__(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"


@dataclass
class SearchOutcome:
    best: Shape | None
    best_rate: float | None
    tried: list[tuple[Shape, float | None]] = field(default_factory=list)  # None: skipped (too big, failed)
    spent_s: float = 0.0
    stopped: str = ""  # why the search ended: "converged", "budget", "grid exhausted"

    def top(self, count: int = 5) -> list[tuple[Shape, float]]:
        measured = [(s, r) for s, r in self.tried if r is not None]
        return sorted(measured, key=lambda item: -item[1])[:count]


def axis_values(low: int, high: int, step: int) -> list[int]:
    """Multiples of ``step`` in [low, high] (low rounded up to a multiple): the grid of one axis."""
    if step <= 0:
        raise ValueError("step must be positive")
    if low > high:
        raise ValueError(f"range [{low}, {high}] is empty")
    first = -(-low // step) * step
    values = list(range(first, high + 1, step))
    if not values:
        raise ValueError(f"no multiple of {step} in [{low}, {high}]")
    return values


def lattice(values: list[int], points: int = LATTICE_POINTS) -> list[int]:
    """``points`` values spread evenly over an axis (both ends included)."""
    if len(values) <= points:
        return list(values)
    return sorted({values[round(i * (len(values) - 1) / (points - 1))] for i in range(points)})


def _nearest(values: list[int], target: int) -> int:
    return min(values, key=lambda v: (abs(v - target), v))


def search(grid: dict[str, list[int]], rate: Callable[[Shape], float | None], budget_s: float, *,
           start: Shape | None = None, seed: int = 0, clock: Callable[[], float] = time.perf_counter
           ) -> SearchOutcome:
    """The fastest shape found on ``grid`` (axis -> sorted values) within ``budget_s`` of ``clock``.

    ``rate(shape)`` measures one shape (higher is better) or returns None to skip it. The budget is
    checked before each measurement, so the search overruns by at most one shape's measurement."""
    for axis in AXES:
        if not grid.get(axis):
            raise ValueError(f"no values for axis {axis}")
    began = clock()
    outcome = SearchOutcome(best=None, best_rate=None)
    seen: dict[Shape, float | None] = {}

    def left() -> float:
        return budget_s - (clock() - began)

    def try_shape(shape: Shape) -> float | None:
        if shape in seen:
            return seen[shape]
        value = rate(shape)
        seen[shape] = value
        outcome.tried.append((shape, value))
        if value is not None and (outcome.best_rate is None or value > outcome.best_rate):
            outcome.best, outcome.best_rate = shape, value
        return value

    explore = [Shape(m, n, k) for m in lattice(grid["m"]) for n in lattice(grid["n"]) for k in lattice(grid["k"])]
    random.Random(seed).shuffle(explore)
    if start is not None:  # the fixed-shape case first: the search never reports less than it without saying so
        first = Shape(*(_nearest(grid[a], getattr(start, a)) for a in AXES))
        explore = [first, *(s for s in explore if s != first)]
    for shape in explore:
        if left() <= budget_s / 2 and outcome.tried:
            break
        try_shape(shape)
    if outcome.best is None:
        outcome.spent_s, outcome.stopped = clock() - began, "budget" if left() <= 0 else "grid exhausted"
        return outcome

    # Refine: strides in grid positions, starting at the lattice spacing.
    position = {a: grid[a].index(getattr(outcome.best, a)) for a in AXES}
    stride = {a: max(1, (len(grid[a]) - 1) // max(1, LATTICE_POINTS - 1) // 2) for a in AXES}
    stopped = "converged"
    while True:
        improved = False
        for axis in AXES:
            for sign in (1, -1):
                if left() <= 0:
                    stopped = "budget"
                    break
                index = position[axis] + sign * stride[axis]
                if not 0 <= index < len(grid[axis]):
                    continue
                candidate = Shape(**{a: grid[a][index if a == axis else position[a]] for a in AXES})
                before = outcome.best_rate
                value = try_shape(candidate)
                if value is not None and before is not None and value > before:
                    position[axis] = index
                    improved = True
            if stopped == "budget":
                break
        if stopped == "budget":
            break
        if not improved:
            if all(s == 1 for s in stride.values()):
                break
            stride = {a: max(1, s // 2) for a, s in stride.items()}
    outcome.spent_s, outcome.stopped = clock() - began, stopped
    return outcome
