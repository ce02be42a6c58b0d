"""Where every store's segments are, as seen from etcd: the data-plane descriptors under
segments/<node>, mirrored (crescent.common.etcd.PrefixMirror), so they survive etcd restarts and a
process starting later sees everything that exists.
"""

from __future__ import annotations

import logging

import msgspec

from crescent.common.etcd import MirrorEvent
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
            log.warning(
                "ignoring malformed segment entry", extra={"key": event.key, "error": str(exc)}
            )
            return
        self._by_node[node] = descriptors
        for descriptor in descriptors:
            self._by_name[descriptor.name] = descriptor

    def __call__(self, name: str) -> SegmentDescriptor | None:
        return self._by_name.get(name)

    def nodes(self) -> list[str]:
        return sorted(self._by_node)
