"""The start-up check a vLLM worker makes of its node's store: blocks of the wrong size would
not fail loudly later, they would show only as per-request load errors and recomputed
prompts, so a mismatch stops the worker with the flag that fixes it."""

from __future__ import annotations

import logging

from crescent.common.bus import Bus
from crescent.common.errors import FatalError, RecoverableError
from crescent.common.naming import Subjects
from crescent.common.store_messages import PinBlocks, PinnedBlocks

log = logging.getLogger(__name__)


async def check_store_block_bytes(
    bus: Bus, subjects: Subjects, node: str, model: str, expected: int, timeout_s: float
) -> None:
    """The store on `node` must hold blocks of exactly `expected` bytes for `model`; no store
    there is only a warning (every prompt is then computed in full)."""
    try:
        pinned = await bus.request(
            subjects.store_ctl(node), PinBlocks(model=model, hashes=[]), PinnedBlocks, timeout_s
        )
    except RecoverableError as exc:
        log.warning(
            "no store answers on this node; prompts are computed in full",
            extra={"node": node, "error": str(exc)},
        )
        return
    if pinned.block_bytes != expected:
        raise FatalError(
            f"the store on node {node} has {pinned.block_bytes}-byte blocks; this model needs "
            f"{expected} (start the store with --block-bytes {expected})"
        )
