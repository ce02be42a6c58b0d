"""Who holds what, as seen from etcd: the data-plane descriptors of every store's segments
(segments/<node>) and the cluster's block index (blocks/<model>/<hash>/<node>).

Both are mirrors (crescent.common.etcd.PrefixMirror), so they survive etcd restarts and a
process starting later sees everything that exists.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import msgspec

from crescent.common.codec import decode
from crescent.common.errors import MessageError
from crescent.common.etcd import MirrorEvent
from crescent.common.store_messages import BlockMeta
from crescent.transfer import SegmentDescriptor

log = logging.getLogger(__name__)

_descriptors = msgspec.msgpack.Decoder(list[SegmentDescriptor])
_encoder = msgspec.msgpack.Encoder()


def encode_segments(descriptors: list[SegmentDescriptor]) -> bytes:
    return _encoder.encode(descriptors)


class SegmentDirectory:
    """A transfer-engine resolver fed by the segments/ mirror: segment name → descriptor."""

    def __init__(self) -> None:
        self._by_node: dict[str, list[SegmentDescriptor]] = {}
        self._by_name: dict[str, SegmentDescriptor] = {}

    def apply(self, event: MirrorEvent) -> None:
        node = event.key.rsplit("/", 1)[-1]
        for old in self._by_node.pop(node, []):
            self._by_name.pop(old.name, None)
        if event.value is None:
            return
        try:
            descriptors = _descriptors.decode(event.value)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("ignoring malformed segment entry", extra={"key": event.key, "error": str(exc)})
            return
        self._by_node[node] = descriptors
        for descriptor in descriptors:
            self._by_name[descriptor.name] = descriptor

    def __call__(self, name: str) -> SegmentDescriptor | None:
        return self._by_name.get(name)

    def nodes(self) -> list[str]:
        return sorted(self._by_node)


class BlockIndex:
    """hash → {node: BlockMeta} for one model, from the blocks/<model>/ mirror."""

    def __init__(self) -> None:
        self.holders: dict[bytes, dict[str, BlockMeta]] = defaultdict(dict)

    def apply(self, event: MirrorEvent) -> None:
        *_, hash_hex, node = event.key.split("/")
        try:
            block_hash = bytes.fromhex(hash_hex)
        except ValueError:
            log.warning("ignoring malformed block key", extra={"key": event.key})
            return
        if event.value is None:
            holders = self.holders.get(block_hash)
            if holders is not None:
                holders.pop(node, None)
                if not holders:
                    del self.holders[block_hash]
            return
        try:
            self.holders[block_hash][node] = decode(event.value, BlockMeta)
        except MessageError as exc:
            log.warning("ignoring malformed block entry", extra={"key": event.key, "error": str(exc)})

    def prefix_by_node(self, hashes: list[bytes]) -> dict[str, int]:
        """For every node holding the first block, how many leading blocks it holds."""
        if not hashes or hashes[0] not in self.holders:
            return {}
        lengths = {node: 1 for node in self.holders[hashes[0]]}
        matching = set(lengths)
        for i, block_hash in enumerate(hashes[1:], start=2):
            matching &= self.holders.get(block_hash, {}).keys()
            if not matching:
                break
            for node in matching:
                lengths[node] = i
        return lengths
