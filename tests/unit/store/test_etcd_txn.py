"""The store's hand-encoded etcd transactions parse to what aetcd's own builders make."""

from aetcd.rpc import rpc_pb2 as rpc
from hypothesis import given
from hypothesis import strategies as st

from crescent.store.etcd_txn import txn_request

changes = st.lists(
    st.tuples(st.binary(min_size=1, max_size=300), st.none() | st.binary(max_size=300)),
    max_size=40,
)


@given(changes, st.integers(min_value=0, max_value=2**63 - 1))
def test_a_transaction_of_puts_and_deletes_matches_protobufs_own(items, lease):
    expected = rpc.TxnRequest(
        success=[
            rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key))
            if value is None
            else rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))
            for key, value in items
        ]
    )
    assert txn_request(items, lease) == expected


def test_an_empty_value_is_still_a_put():
    op = txn_request([(b"k", b"")], 7).success[0]
    assert op.HasField("request_put") and op.request_put.lease == 7
