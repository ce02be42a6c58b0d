"""An explicit transport choice: parsed strictly, and refused at start where it cannot run."""

import pytest

from crescent.transfer import TransportKind, TransportUnavailable, parse_transports
from crescent.transfer.transports import check_transports
from crescent.transfer.transports.rdma import unavailable_reason


def test_names_parse_in_the_order_given():
    assert parse_transports("tcp") == (TransportKind.TCP,)
    assert parse_transports(" SHM , tcp ") == (TransportKind.SHM, TransportKind.TCP)
    assert parse_transports("") is None


@pytest.mark.parametrize(
    ("text", "error"),
    [("udp", "unknown transport udp: choose from shm, tcp, rdma"), ("tcp,tcp", "named twice")],
)
def test_bad_names_are_refused_with_the_reason(text, error):
    with pytest.raises(ValueError, match=error):
        parse_transports(text)


def test_rdma_without_a_device_is_unavailable_not_skipped():
    reason = unavailable_reason()
    if reason is None:
        pytest.skip("this machine has RDMA")
    check_transports((TransportKind.SHM, TransportKind.TCP))
    with pytest.raises(TransportUnavailable, match=f"rdma unavailable: {reason}"):
        check_transports((TransportKind.TCP, TransportKind.RDMA))
