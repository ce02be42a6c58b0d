"""T_prefill as a polynomial in the input length n and the cached prefix length p (paper §4.1).

Prefill cost is l·(a·(n² − p²)·d + b·(n − p)·d²) (the paper's Eq. 1), a degree-2 polynomial,
so a degree-2 fit on profiled (n, p, seconds) samples predicts well with few samples and no
numpy: `crescent profile` fits it, writes `to_dict()`, and the conductor and simulator load it
with `from_dict`. Inputs are scaled to [0, 1] before fitting so the normal equations stay well
conditioned at 100k-token contexts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FORMAT = "crescent.prefill_poly.v1"


def _terms(degree: int) -> tuple[tuple[int, int], ...]:
    """Exponents (i, j) of every monomial nⁱ·pʲ with i + j ≤ degree."""
    return tuple((i, t - i) for t in range(degree + 1) for i in range(t, -1, -1))


@dataclass(frozen=True)
class PrefillTimeModel:
    """seconds ≈ Σ coef · (n/scale)ⁱ · (p/scale)ʲ, never negative."""

    degree: int
    scale: float
    coefficients: tuple[float, ...]

    def __post_init__(self) -> None:
        if self.degree < 0 or not self.scale > 0:
            raise ValueError(f"bad prefill model: degree {self.degree}, scale {self.scale}")
        if len(self.coefficients) != len(_terms(self.degree)):
            raise ValueError(
                f"degree {self.degree} needs {len(_terms(self.degree))} coefficients, "
                f"got {len(self.coefficients)}"
            )

    def predict(self, num_tokens: int, num_cached_tokens: int = 0) -> float:
        n = num_tokens / self.scale
        p = min(num_cached_tokens, num_tokens) / self.scale
        total = 0.0
        for (i, j), coef in zip(_terms(self.degree), self.coefficients):
            total += coef * n**i * p**j
        return max(0.0, total)

    __call__ = predict

    @classmethod
    def fit(cls, samples: Sequence[tuple[int, int, float]], degree: int = 2) -> PrefillTimeModel:
        """Least squares over (num_tokens, num_cached_tokens, seconds) profile samples."""
        terms = _terms(degree)
        if len(samples) < len(terms):
            raise ValueError(
                f"a degree-{degree} fit needs at least {len(terms)} samples, got {len(samples)}"
            )
        scale = float(max(max(n, p) for n, p, _ in samples)) or 1.0
        rows = [
            [(n / scale) ** i * (min(p, n) / scale) ** j for i, j in terms] for n, p, _ in samples
        ]
        targets = [seconds for _, _, seconds in samples]
        k = len(terms)
        gram = [[sum(r[a] * r[b] for r in rows) for b in range(k)] for a in range(k)]
        rhs = [sum(r[a] * y for r, y in zip(rows, targets)) for a in range(k)]
        return cls(degree, scale, tuple(_solve(gram, rhs)))

    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "degree": self.degree,
            "scale": self.scale,
            "coefficients": list(self.coefficients),
        }

    @classmethod
    def from_dict(cls, data: dict) -> PrefillTimeModel:
        if data.get("format") != FORMAT:
            raise ValueError(
                f"not a prefill time model: format {data.get('format')!r}, want {FORMAT!r}"
            )
        return cls(
            int(data["degree"]), float(data["scale"]), tuple(float(c) for c in data["coefficients"])
        )


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting; a singular system means too few distinct
    samples (e.g. every profile at the same prefix length), which the caller must fix."""
    k = len(rhs)
    a = [row[:] + [b] for row, b in zip(matrix, rhs)]
    largest = max(abs(x) for row in matrix for x in row) or 1.0
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) <= 1e-12 * largest:
            raise ValueError("profile samples do not determine the polynomial: vary both n and p")
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, k):
            factor = a[r][col] / a[col][col]
            if factor:
                for c in range(col, k + 1):
                    a[r][c] -= factor * a[col][c]
    solution = [0.0] * k
    for r in range(k - 1, -1, -1):
        solution[r] = (a[r][k] - sum(a[r][c] * solution[c] for c in range(r + 1, k))) / a[r][r]
    return solution
