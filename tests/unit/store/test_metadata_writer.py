"""The store's block metadata writer against a recording stand-in for etcd's transaction API:
last change per key wins, batches land in order, flush and the backlog bound keep deadlines."""

import asyncio
from types import SimpleNamespace

import pytest

from crescent.common.naming import Keys
from crescent.common.store_messages import BlockMeta
from crescent.store.metadata import MetadataNotWritten, MetadataWriter

META = BlockMeta(tier="dram", slot=0, size=1)
HASH = b"\x01" * 16


class RecordingEtcd:
    """Applies transactions (aetcd's KV stub: TxnRequest messages) to a dict, in the order they
    complete; `gate` holds them back."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.ops_seen: list[tuple[str, bytes]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.metadata = None
        self.kvstub = SimpleNamespace(Txn=self._txn)

    async def connect(self) -> None:
        pass

    async def _txn(self, request, timeout, metadata):
        await self.gate.wait()
        for op in request.success:
            if op.HasField("request_put"):
                self.ops_seen.append(("put", op.request_put.key))
                self.data[op.request_put.key] = op.request_put.value
            else:
                self.ops_seen.append(("delete", op.request_delete_range.key))
                self.data.pop(op.request_delete_range.key, None)


@pytest.fixture
async def writer_and_etcd():
    etcd = RecordingEtcd()
    writer = MetadataWriter(etcd, SimpleNamespace(lease=None), Keys("c"), "n1", max_pending_keys=4)
    task = asyncio.create_task(writer.run())
    yield writer, etcd
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_delete_after_a_put_wins_queued_together_or_while_the_put_is_written(
    writer_and_etcd,
):
    writer, etcd = writer_and_etcd
    writer.put("m", HASH, META)
    writer.delete("m", HASH)
    await writer.sync(1)
    assert etcd.data == {}
    etcd.gate.clear()
    writer.put("m", HASH, META)
    await asyncio.sleep(0.05)  # the put's batch is now in flight, held at etcd
    writer.delete("m", HASH)
    etcd.gate.set()
    await writer.sync(1)
    assert etcd.data == {} and [kind for kind, _ in etcd.ops_seen[-2:]] == ["put", "delete"]


async def test_flush_says_false_when_etcd_does_not_answer_in_time(writer_and_etcd):
    writer, etcd = writer_and_etcd
    etcd.gate.clear()
    writer.put("m", HASH, META)
    assert await writer.flush(0.1) is False
    etcd.gate.set()
    assert await writer.flush(1) is True
    assert writer.num_unwritten == 0 and len(etcd.data) == 1


async def test_a_full_backlog_makes_the_next_commit_wait_for_etcd(writer_and_etcd):
    writer, etcd = writer_and_etcd
    etcd.gate.clear()
    for i in range(4):
        writer.put("m", bytes([i]) * 16, META)
    with pytest.raises(MetadataNotWritten, match="4 block metadata keys"):
        await writer.make_room(0.1)
    etcd.gate.set()
    await writer.make_room(1)
    assert writer.num_unwritten == 0 and len(etcd.data) == 4
