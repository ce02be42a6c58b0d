"""SegmentDescriptor encoding and validation."""

from __future__ import annotations

import msgspec
import pytest

from crescent.transfer import (
    RdmaEndpoint,
    SegmentDescriptor,
    ShmEndpoint,
    TcpEndpoint,
    decode_descriptor,
    encode_descriptor,
)


def descriptor() -> SegmentDescriptor:
    return SegmentDescriptor(
        name="n1/kv",
        node="n1",
        host_id="boot-1",
        size=1 << 30,
        endpoints=(ShmEndpoint("crescent-abc", 27, 5), TcpEndpoint("10.0.0.1", 7000, 3)),
    )


def test_round_trips_through_msgpack() -> None:
    assert decode_descriptor(encode_descriptor(descriptor())) == descriptor()


def test_endpoint_finds_each_transport() -> None:
    d = descriptor()
    assert d.endpoint(TcpEndpoint) == TcpEndpoint("10.0.0.1", 7000, 3)
    assert d.endpoint(ShmEndpoint) == ShmEndpoint("crescent-abc", 27, 5)
    assert d.endpoint(RdmaEndpoint) is None


def test_rdma_endpoint_round_trips() -> None:
    rdma = RdmaEndpoint("mlx5_0", 1, 0, "fe80::1", 0, 0x7F0000000000, 1234, "10.0.0.1", 7001)
    d = msgspec.structs.replace(descriptor(), endpoints=(rdma,))
    assert decode_descriptor(encode_descriptor(d)).endpoint(RdmaEndpoint) == rdma


@pytest.mark.parametrize(
    "body",
    [
        {"name": "x", "node": "n", "host_id": "h"},  # no size
        {"name": "x", "node": "n", "host_id": "h", "size": "big"},
        {"name": "x", "node": "n", "host_id": "h", "size": 1, "endpoints": [{"type": "ftp"}]},
        {"name": "x", "node": "n", "host_id": "h", "size": 1, "v": 2},
    ],
)
def test_malformed_descriptors_are_rejected(body: dict) -> None:
    with pytest.raises(msgspec.ValidationError):
        decode_descriptor(msgspec.msgpack.encode(body))


def test_garbage_is_rejected() -> None:
    with pytest.raises(msgspec.DecodeError):
        decode_descriptor(b"\xc1\xc1")
