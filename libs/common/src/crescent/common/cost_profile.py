"""What an engine costs, as its worker measured it: the model every prediction is priced with.

Each prefill and decode worker publishes one CostProfile under costs/<role>/<id> in etcd (its
lease), and prices its own queue with it; the conductor prices that instance with the same
profile. So worker and conductor never disagree about an instance's speed, and a cluster of
mixed hardware is priced per instance.

- Prefill of n prompt tokens whose first p are cached:
      base_s + per_token_s·(n − p) + per_token_pair_s·(n² − p²) + per_cached_token_s·p
  the paper's Eq. 1 (linear layers ∝ new tokens, attention ∝ n² − p²) plus a fixed cost per
  step and the cost of loading each cached token.
- Decode, one step of a batch of b requests holding c context tokens in all:
      max over planes of (base_s + per_request_s·b + per_context_token_s·c)
  one plane for a fitted engine; two for a roofline (memory-bound vs compute-bound).

Every coefficient is a cost, so none may be negative: a profile with one is refused, as is a
profile of another model. Fits use non-negative least squares for the same reason.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path

import msgspec

from crescent.common.codec import Message
from crescent.common.errors import ConfigError

SOURCES = ("measured", "stored", "file", "emulated")


class ProfileError(ConfigError):
    """A cost profile that cannot price anything: wrong model, negative or missing costs."""


class PrefillCost(msgspec.Struct, kw_only=True, omit_defaults=True):
    base_s: float = 0.0
    per_token_s: float = 0.0
    per_token_pair_s: float = 0.0
    per_cached_token_s: float = 0.0

    def seconds(self, num_tokens: int, num_cached_tokens: int = 0) -> float:
        n = num_tokens
        p = min(num_cached_tokens, n)
        return (
            self.base_s
            + self.per_token_s * (n - p)
            + self.per_token_pair_s * (n * n - p * p)
            + self.per_cached_token_s * p
        )


class DecodePlane(msgspec.Struct, kw_only=True, omit_defaults=True):
    base_s: float = 0.0
    per_request_s: float = 0.0
    per_context_token_s: float = 0.0

    def seconds(self, batch_size: int, total_context: int) -> float:
        return (
            self.base_s + self.per_request_s * batch_size + self.per_context_token_s * total_context
        )


class CostProfile(Message):
    """Value of costs/<role>/<id>; also the JSON form of a stored profile file."""

    model: str
    prefill: PrefillCost
    decode: list[DecodePlane]
    dtype: str = ""
    hardware: str = ""
    source: str = "measured"  # one of SOURCES: how the publishing worker got it

    def prefill_s(self, num_tokens: int, num_cached_tokens: int = 0) -> float:
        return self.prefill.seconds(num_tokens, num_cached_tokens)

    def decode_step_s(self, batch_size: int, total_context: int) -> float:
        """The slowest plane's step (DecodePlane.seconds, written out: the conductor prices a
        dozen steps a decision, and a generator of method calls takes 2.7× as long)."""
        if batch_size <= 0:
            return 0.0
        slowest = None
        for plane in self.decode:
            seconds = (
                plane.base_s
                + plane.per_request_s * batch_size
                + plane.per_context_token_s * total_context
            )
            if slowest is None or seconds > slowest:
                slowest = seconds
        if slowest is None:
            raise ValueError("a cost profile without a decode plane prices no step")
        return slowest


def check_profile(
    profile: CostProfile, model: str, dtype: str = "", hardware: str = ""
) -> CostProfile:
    """`profile` if it can price `model`'s work (run with `dtype` on `hardware`, where given: a
    profile that names others was measured on another engine); ProfileError saying what is
    wrong otherwise."""
    problems = []
    if profile.model != model:
        problems.append(f"it is a profile of model {profile.model!r}, not {model!r}")
    for name, expected in (("dtype", dtype), ("hardware", hardware)):
        measured = getattr(profile, name)
        if expected and measured and measured != expected:
            problems.append(
                f"it was measured with {name} {measured!r}, this engine's is {expected!r}"
            )
    if profile.source not in SOURCES:
        problems.append(f"source {profile.source!r} is not one of {', '.join(SOURCES)}")
    if not profile.decode:
        problems.append("it has no decode plane")
    terms = [("prefill", profile.prefill)] + [
        (f"decode[{i}]", p) for i, p in enumerate(profile.decode)
    ]
    for where, term in terms:
        for name in term.__struct_fields__:
            value = getattr(term, name)
            if not math.isfinite(value) or value < 0:
                problems.append(f"{where}.{name} is {value!r} (a cost must be finite and >= 0)")
    if problems:
        raise ProfileError(f"cost profile refused: {'; '.join(problems)}")
    return profile


def load_profile(path: Path, model: str, dtype: str = "", hardware: str = "") -> CostProfile:
    """A profile file (JSON), checked for `model` (and `dtype`, `hardware`: check_profile);
    ProfileError if it is unreadable or unfit."""
    try:
        profile = msgspec.json.decode(path.read_bytes(), type=CostProfile)
    except OSError as exc:
        raise ProfileError(f"cannot read cost profile {path}: {exc}") from exc
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProfileError(f"cost profile {path} is not a profile: {exc}") from exc
    try:
        return check_profile(profile, model, dtype, hardware)
    except ProfileError as exc:
        raise ProfileError(f"{path}: {exc}") from exc


def save_profile(path: Path, profile: CostProfile) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(profile)))
    tmp.replace(path)  # a reader never sees half a file


def profile_file_name(model: str, dtype: str, hardware: str) -> str:
    """The cache file of a (model, dtype, hardware) triple: one measurement serves every
    later start of the same engine on the same kind of machine."""
    text = f"{model}-{dtype}-{hardware}"
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text) + ".json"


def fit_prefill(samples: Sequence[tuple[int, int, float]]) -> PrefillCost:
    """(num_tokens, num_cached_tokens, seconds) samples → the non-negative PrefillCost that
    fits them best."""
    rows = [[1.0, n - p, float(n * n - p * p), p] for n, p, _ in samples]
    base, per_token, per_pair, per_cached = nonnegative_least_squares(
        rows, [s for _, _, s in samples]
    )
    return PrefillCost(
        base_s=base, per_token_s=per_token, per_token_pair_s=per_pair, per_cached_token_s=per_cached
    )


def fit_decode(samples: Sequence[tuple[int, int, float]]) -> DecodePlane:
    """(batch_size, total_context, seconds per step) samples → one non-negative plane."""
    rows = [[1.0, b, c] for b, c, _ in samples]
    base, per_request, per_token = nonnegative_least_squares(rows, [s for _, _, s in samples])
    return DecodePlane(base_s=base, per_request_s=per_request, per_context_token_s=per_token)


def nonnegative_least_squares(
    rows: Sequence[Sequence[float]], targets: Sequence[float]
) -> list[float]:
    """argmin ‖Ax − y‖ over x ≥ 0, for the few columns a cost model has: the optimum is the
    unconstrained fit on some subset of columns, so try every subset (2^k − 1 of them) and keep
    the best fit that has no negative coefficient. Columns are scaled to unit size first."""
    k = len(rows[0])
    scales = [max(abs(r[j]) for r in rows) or 1.0 for j in range(k)]
    scaled = [[r[j] / scales[j] for j in range(k)] for r in rows]
    best: list[float] | None = None
    best_residual = math.inf
    for size in range(1, k + 1):
        for columns in itertools.combinations(range(k), size):
            solution = _least_squares([[r[j] for j in columns] for r in scaled], targets)
            if solution is None or min(solution) < 0:
                continue
            full = [0.0] * k
            for j, value in zip(columns, solution):
                full[j] = value
            residual = sum(
                (sum(a * x for a, x in zip(r, full)) - y) ** 2 for r, y in zip(scaled, targets)
            )
            if residual < best_residual:
                best, best_residual = full, residual
    if best is None:
        raise ProfileError("no non-negative cost model fits the samples")
    return [x / s for x, s in zip(best, scales)]


def _least_squares(rows: list[list[float]], targets: Sequence[float]) -> list[float] | None:
    """Normal equations solved by Gaussian elimination; None when the columns are dependent."""
    k = len(rows[0])
    a = [
        [sum(r[i] * r[j] for r in rows) for j in range(k)]
        + [sum(r[i] * y for r, y in zip(rows, targets))]
        for i in range(k)
    ]
    largest = max(abs(a[i][j]) for i in range(k) for j in range(k)) or 1.0
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) <= 1e-12 * largest:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, k):
            factor = a[r][col] / a[col][col]
            for c in range(col, k + 1):
                a[r][c] -= factor * a[col][c]
    solution = [0.0] * k
    for r in range(k - 1, -1, -1):
        solution[r] = (a[r][k] - sum(a[r][c] * solution[c] for c in range(r + 1, k))) / a[r][r]
    return solution
