"""Fixtures of the store's integration tests: real store processes and clients."""

import pytest
from store_helpers import Stores

from crescent.common.bus import Bus
from crescent.common.etcd import connect_etcd
from crescent.storeclient.client import ClientConfig, StoreClient
from crescent.transfer import TransferConfig, TransportKind


@pytest.fixture
def stores(infra, cluster_name, tmp_path):
    stores = Stores(infra, cluster_name, tmp_path)
    yield stores
    stores.stop_all()


@pytest.fixture
async def client_factory(infra, cluster_name):
    made = []

    async def make(
        node: str = "client-node",
        use_mapping: bool = True,
        transports: tuple[TransportKind, ...] | None = None,
        **transfer_settings: int,
    ) -> StoreClient:
        bus = await Bus.connect(infra.nats_url, f"client-{node}")
        etcd = await connect_etcd(infra.etcd_url)
        transfer = TransferConfig(node=node, transports=transports, **transfer_settings)
        client = StoreClient(
            bus,
            etcd,
            cluster_name,
            ClientConfig(
                node=node,
                use_mapping=use_mapping,
                staging_bytes=8 << 20,
                timeout_s=10,
                transfer=transfer,
            ),
        )
        await client.start()
        made.append((client, bus, etcd))
        return client

    yield make
    for client, bus, etcd in made:
        await client.close()
        await bus.drain()
        await etcd.close()
