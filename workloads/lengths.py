"""Token-length distributions for prompts and outputs (and small integer choices for n / beam width).

Every distribution draws a whole array at once from the generator it is given and rounds to
integers >= 1; clipping to `max_model_len` happens later, in `workloads.spec`, where it is counted.
`mean` and `std` are the parameters' values (before rounding and the floor of 1 token), which
is what the tests compare the samples against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from kvsim.simcore.errors import WorkloadError

_MOST_TOKENS = 2**53  # a draw beyond (a huge std) stays a huge length, not an int64 overflow


def _to_tokens(x: np.ndarray) -> np.ndarray:
    """Round to whole tokens, at least one (at most 2**53: clipping to max_model_len comes later)."""
    return np.minimum(np.maximum(np.rint(x), 1), _MOST_TOKENS).astype(np.int64)


class LengthDist(Protocol):
    """A distribution of token counts."""

    kind: ClassVar[str]

    @property
    def mean(self) -> float: ...

    @property
    def std(self) -> float: ...

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray: ...

    def with_mean(self, mean: float) -> LengthDist:
        """The same shape moved (or scaled) to a new mean: what `--input-len` overrides."""
        ...

    def describe(self) -> dict[str, Any]: ...


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise WorkloadError(f"{name} must be > 0, got {value}")


@dataclass(frozen=True, slots=True)
class Fixed:
    """Every request has the same length."""

    value: int  # >= 1
    kind: ClassVar[str] = "fixed"

    def __post_init__(self) -> None:
        if int(self.value) != self.value or self.value < 1:
            raise WorkloadError(f"fixed length must be an integer >= 1, got {self.value}")

    @property
    def mean(self) -> float:
        return float(self.value)

    @property
    def std(self) -> float:
        return 0.0

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return np.full(size, int(self.value), dtype=np.int64)

    def with_mean(self, mean: float) -> Fixed:
        return Fixed(max(1, round(mean)))

    def describe(self) -> dict[str, Any]:
        return {"dist": self.kind, "value": int(self.value)}


@dataclass(frozen=True, slots=True)
class Uniform:
    """Integers uniform on [low, high], both included."""

    low: int  # >= 1
    high: int  # >= low
    kind: ClassVar[str] = "uniform"

    def __post_init__(self) -> None:
        if self.low < 1 or self.high < self.low:
            raise WorkloadError(f"uniform length needs 1 <= low <= high, got low={self.low} high={self.high}")

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2

    @property
    def std(self) -> float:
        width = self.high - self.low + 1
        return float(np.sqrt((width * width - 1) / 12))

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.integers(self.low, self.high + 1, size=size, dtype=np.int64)

    def with_mean(self, mean: float) -> Uniform:
        ratio = mean / self.mean
        low = max(1, round(self.low * ratio))
        return Uniform(low, max(low, round(self.high * ratio)))

    def describe(self) -> dict[str, Any]:
        return {"dist": self.kind, "low": int(self.low), "high": int(self.high)}


@dataclass(frozen=True, slots=True)
class Normal:
    """Normal with the given mean and standard deviation, rounded; draws below 1 become 1."""

    mean: float
    std: float  # >= 0
    kind: ClassVar[str] = "normal"

    def __post_init__(self) -> None:
        _positive("normal mean", self.mean)
        if self.std < 0:
            raise WorkloadError(f"normal std must be >= 0, got {self.std}")

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return _to_tokens(rng.normal(self.mean, self.std, size=size))

    def with_mean(self, mean: float) -> Normal:
        return Normal(mean, self.std * mean / self.mean)

    def describe(self) -> dict[str, Any]:
        return {"dist": self.kind, "mean": self.mean, "std": self.std}


@dataclass(frozen=True, slots=True)
class LogNormal:
    """Log-normal given the mean and standard deviation of the lengths themselves (not of their log)."""

    mean: float
    std: float  # > 0
    kind: ClassVar[str] = "lognormal"

    def __post_init__(self) -> None:
        _positive("lognormal mean", self.mean)
        _positive("lognormal std", self.std)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        sigma2 = np.log1p((self.std / self.mean) ** 2)
        mu = np.log(self.mean) - sigma2 / 2
        return _to_tokens(rng.lognormal(mu, np.sqrt(sigma2), size=size))

    def with_mean(self, mean: float) -> LogNormal:
        return LogNormal(mean, self.std * mean / self.mean)  # keeps the coefficient of variation

    def describe(self) -> dict[str, Any]:
        return {"dist": self.kind, "mean": self.mean, "std": self.std}


@dataclass(frozen=True, slots=True)
class Zipf:
    """Bounded Zipf: rank k in 1..high with P(k) ~ k**-a, length = round(scale * k).

    Bounded so that any exponent a > 0 has a finite mean (numpy's unbounded zipf needs a > 2)."""

    a: float  # > 0
    high: int  # >= 1, largest rank
    scale: float = 1.0  # > 0, tokens per rank
    kind: ClassVar[str] = "zipf"

    def __post_init__(self) -> None:
        _positive("zipf a", self.a)
        _positive("zipf scale", self.scale)
        if self.high < 1:
            raise WorkloadError(f"zipf high must be >= 1, got {self.high}")

    def _pmf(self) -> tuple[np.ndarray, np.ndarray]:
        ranks = np.arange(1, int(self.high) + 1, dtype=np.float64)
        weights = ranks ** -float(self.a)
        return ranks, weights / weights.sum()

    @property
    def mean(self) -> float:
        ranks, pmf = self._pmf()
        return float(self.scale * (ranks * pmf).sum())

    @property
    def std(self) -> float:
        ranks, pmf = self._pmf()
        m = (ranks * pmf).sum()
        return float(self.scale * np.sqrt(((ranks - m) ** 2 * pmf).sum()))

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        _, pmf = self._pmf()
        cdf = np.cumsum(pmf)
        ranks = np.minimum(np.searchsorted(cdf, rng.random(size), side="right"), len(cdf) - 1) + 1
        return _to_tokens(ranks * self.scale)

    def with_mean(self, mean: float) -> Zipf:
        return Zipf(self.a, self.high, self.scale * mean / self.mean)

    def describe(self) -> dict[str, Any]:
        return {"dist": self.kind, "a": float(self.a), "high": int(self.high), "scale": float(self.scale)}


@dataclass(frozen=True, slots=True)
class Empirical:
    """Resample (with replacement) the lengths observed in a trace, times `scale`."""

    values: np.ndarray = field(repr=False, compare=False)  # observed lengths, >= 1
    source: str = ""  # where the values came from, e.g. "azure-conv:prompt"
    scale: float = 1.0  # > 0
    kind: ClassVar[str] = "empirical"

    def __post_init__(self) -> None:
        if len(self.values) == 0:
            raise WorkloadError(f"empirical length from {self.source or 'a trace'} has no values")
        _positive("empirical scale", self.scale)

    @property
    def mean(self) -> float:
        return float(self.scale * np.mean(self.values))

    @property
    def std(self) -> float:
        return float(self.scale * np.std(self.values))

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        draws = rng.choice(self.values, size=size, replace=True)
        return draws.astype(np.int64) if self.scale == 1.0 else _to_tokens(draws * self.scale)

    def with_mean(self, mean: float) -> Empirical:
        return Empirical(self.values, self.source, self.scale * mean / self.mean)

    def describe(self) -> dict[str, Any]:
        return {"dist": self.kind, "source": self.source, "num_values": len(self.values), "scale": self.scale}


@dataclass(frozen=True, slots=True)
class Categorical:
    """A small integer choice, for n (parallel samples) and beam width: values with weights."""

    values: tuple[int, ...]  # each >= 1
    weights: tuple[float, ...] = ()  # same length as values, or empty for equal weights

    def __post_init__(self) -> None:
        if not self.values or any(int(v) != v or v < 1 for v in self.values):
            raise WorkloadError(f"choice values must be integers >= 1, got {list(self.values)}")
        if self.weights and (len(self.weights) != len(self.values) or min(self.weights) < 0 or sum(self.weights) <= 0):
            raise WorkloadError(f"choice weights must be {len(self.values)} non-negative numbers, got {list(self.weights)}")

    @property
    def is_fixed(self) -> bool:
        return len(self.values) == 1

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        if self.is_fixed:
            return np.full(size, int(self.values[0]), dtype=np.int64)
        p = np.asarray(self.weights, dtype=np.float64) if self.weights else None
        return rng.choice(np.asarray(self.values, dtype=np.int64), size=size, p=None if p is None else p / p.sum())

    def describe(self) -> int | dict[str, Any]:
        if self.is_fixed:
            return int(self.values[0])
        return {"values": [int(v) for v in self.values], "weights": [float(w) for w in self.weights]}
