"""Baseline picks the paper compares against (§4.2, Fig. 5): random and round robin.
Least-loaded lives in least_loaded.py (the conductor's first policy); local cache-aware is
kv_centric without transfers. All of them order candidates by id first, so a seeded Random or
a cursor gives the same picks for the same snapshots."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


def random_pick(items: Sequence[T], ids: Sequence[str], rng: random.Random) -> T | None:
    """A uniformly random item; `ids[i]` names `items[i]` and fixes the order the rng indexes."""
    if not items:
        return None
    order = sorted(range(len(items)), key=ids.__getitem__)
    return items[order[rng.randrange(len(order))]]


@dataclass
class RoundRobinCursor:
    """The last ids handed work. Remembering ids, not positions, keeps the rotation fair when
    instances join or leave between requests."""

    last_prefill: str | None = None
    last_decode: str | None = None


def next_in_turn(items: Sequence[T], ids: Sequence[str], last: str | None) -> T | None:
    """The item whose id comes next after `last` in sorted order, wrapping around."""
    if not items:
        return None
    order = sorted(range(len(items)), key=ids.__getitem__)
    if last is not None:
        for i in order:
            if ids[i] > last:
                return items[i]
    return items[order[0]]
