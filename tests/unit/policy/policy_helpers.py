"""Builders shared by the policy tests: small snapshots and linear cost models whose TTFTs can
be worked out by hand."""

from __future__ import annotations

import hashlib

from crescent.conductor.policy import (
    BandwidthTable,
    BlockIndex,
    ClusterSnapshot,
    CostPredictors,
    InstanceSnapshot,
    ScheduleRequest,
)

BLOCK = 16  # tokens per block in hand-worked examples


def chain(name: str, num_blocks: int) -> list[bytes]:
    """Stand-ins for chained block hashes: distinct per (name, position)."""
    return [
        hashlib.blake2b(f"{name}/{i}".encode(), digest_size=16).digest() for i in range(num_blocks)
    ]


def linear_predictors(
    prefill_per_token_s: float = 0.001,
    kv_bytes_per_token: float = 100.0,
    step_base_s: float = 0.01,
    step_per_request_s: float = 0.002,
    step_per_context_token_s: float = 1e-6,
    prefill_step_s: float = 0.0,
) -> CostPredictors:
    """T_prefill = step + (n − p)·rate; TBT = base + batch·a + context·b: easy to check by
    hand."""
    return CostPredictors(
        prefill_s=lambda n, p: prefill_step_s + (n - p) * prefill_per_token_s,
        decode_step_s=lambda batch, ctx: (
            step_base_s + batch * step_per_request_s + ctx * step_per_context_token_s
        ),
        kv_bytes_per_token=kv_bytes_per_token,
    )


def prefill(
    instance_id: str, node: str | None = None, queue_s: float = 0.0, **fields
) -> InstanceSnapshot:
    return InstanceSnapshot(
        instance_id, node or f"node-{instance_id}", 0, 0, queue_s, 0, 0, **fields
    )


def decode(
    instance_id: str,
    num_running: int = 0,
    context: int = 0,
    used: int = 0,
    capacity: int = 100_000,
    **fields,
) -> InstanceSnapshot:
    return InstanceSnapshot(
        instance_id,
        f"node-{instance_id}",
        0,
        num_running,
        0.0,
        used,
        capacity,
        context_tokens=context,
        **fields,
    )


def request(
    hashes: list[bytes],
    num_prompt_tokens: int | None = None,
    max_tokens: int = 16,
    block_size: int = BLOCK,
    request_id: str = "r",
) -> ScheduleRequest:
    n = num_prompt_tokens if num_prompt_tokens is not None else len(hashes) * block_size + 1
    return ScheduleRequest(request_id, tuple(hashes), n, block_size, max_tokens)


def index_with(holdings: dict[str, list[bytes]]) -> BlockIndex:
    index = BlockIndex()
    for node, hashes in holdings.items():
        index.add_many(hashes, node)
    return index


def cluster(
    prefills,
    decodes,
    index: BlockIndex | None = None,
    bandwidth: BandwidthTable | None = None,
    inflight=(),
) -> ClusterSnapshot:
    return ClusterSnapshot(
        list(prefills),
        list(decodes),
        index or BlockIndex(),
        bandwidth or BandwidthTable(1e6),
        tuple(inflight),
    )
