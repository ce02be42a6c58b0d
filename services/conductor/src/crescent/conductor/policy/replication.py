"""Hot-spot migration (paper §4.2): hot prefixes gain replicas by themselves.

Two sources of orders, both "pull these blocks from node X into node Y's store and keep them":

- on demand: the KV-centric choice sent a request to an instance that lacks the best prefix
  because pulling it beats recomputing it (kv_centric applies both the balancing threshold and
  that cost test); the pulled blocks stay as a replica, so the next request with this prefix
  finds it on one more node.
- hot-block pass: run periodically by the conductor, it gives the hottest blocks extra
  replicas, up to a cap, on the least-loaded prefill nodes, so load can spread before anyone
  has to wait for a pull.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from crescent.conductor.policy.bandwidth import BandwidthTable
from crescent.conductor.policy.block_heat import BlockHeat
from crescent.conductor.policy.decision import PrefillChoice, ReplicationOrder, ReplicationReason
from crescent.conductor.policy.snapshot import InstanceSnapshot


def on_demand_order(choice: PrefillChoice) -> ReplicationOrder | None:
    """The replica a transfer in `choice` leaves behind; None when the choice pulls nothing."""
    if choice.source_node is None or not choice.pull_hashes:
        return None
    return ReplicationOrder(
        choice.source_node, choice.node, choice.pull_hashes, ReplicationReason.ON_DEMAND
    )


@dataclass(frozen=True)
class HotSpotConfig:
    num_hottest: int = 64  # blocks considered per pass
    replica_cap: int = 4  # no block gets more replicas than this from the pass
    min_hits: float = 8.0  # decayed hits below which a block is not hot
    max_new_per_block: int = 1  # new replicas per block per pass: grow gradually, bound traffic

    def __post_init__(self) -> None:
        if self.num_hottest < 0 or self.replica_cap < 1 or self.max_new_per_block < 1:
            raise ValueError(f"bad hot-spot config: {self}")


def rank_target_nodes(prefill: Sequence[InstanceSnapshot]) -> list[str]:
    """Nodes of usable prefill instances, least queued first (a node's shortest queue counts):
    replicas there let the KV-centric choice move load onto them without a pull."""
    queue: dict[str, float] = {}
    for s in prefill:
        if s.is_usable:
            queue[s.node] = min(queue.get(s.node, s.queue_time_s), s.queue_time_s)
    return sorted(queue, key=lambda node: (queue[node], node))


def hot_spot_orders(
    heat: BlockHeat,
    target_nodes: Sequence[str],
    bandwidth: BandwidthTable,
    now: float,
    config: HotSpotConfig = HotSpotConfig(),
) -> list[ReplicationOrder]:
    """Orders giving each hot block up to `max_new_per_block` more replicas, below the cap.

    Targets are tried in the given order, so the blocks of one hot prefix land on the same
    node: a replica is only useful with its whole prefix, since matching stops at a gap.
    Within an order, blocks are listed parents first.
    """
    index = heat.index
    planned: dict[tuple[str, str], list[tuple[int, bytes]]] = {}
    for block in heat.hottest(config.num_hottest, now):
        if block.hits < config.min_hits:
            break
        holders = index.holders(block.hash)
        wanted = min(config.replica_cap - block.num_replicas, config.max_new_per_block)
        for target in target_nodes:
            if wanted <= 0:
                break
            if target in holders:
                continue
            source, _ = bandwidth.fastest_source(holders, target)
            depth = heat.depth(block.hash)
            planned.setdefault((source, target), []).append(
                (0 if depth is None else depth, block.hash)
            )
            wanted -= 1
    return [
        ReplicationOrder(src, dst, tuple(h for _, h in sorted(blocks)), ReplicationReason.HOT_SPOT)
        for (src, dst), blocks in sorted(planned.items())
    ]
