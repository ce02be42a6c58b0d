"""`--transports` (store) and `--kv-transports` (a worker's KV, either engine): what cannot run is a
configuration error at start, naming the flag and the reason."""

import pytest

from crescent.common.errors import ConfigError
from crescent.engine.settings import EngineSettings
from crescent.store.settings import StoreSettings
from crescent.storeclient.transport_choice import transport_choice
from crescent.transfer import TransportKind
from crescent.transfer.transports.rdma import unavailable_reason


def test_choice_is_the_named_transports():
    assert transport_choice("transports", "tcp") == (TransportKind.TCP,)
    assert transport_choice("transports", "") is None


@pytest.mark.parametrize("engine", ["vllm", "emulated"])
def test_unknown_transport_names_the_flag(engine):
    with pytest.raises(ConfigError, match="--kv-transports udp: unknown transport udp"):
        EngineSettings(engine=engine, kv_transports="udp").validate()


def _rdma_unavailable() -> str:
    reason = unavailable_reason()
    if reason is None:
        pytest.skip("this machine has RDMA")
    return reason


def test_rdma_without_a_device_stops_the_store_at_start():
    reason = _rdma_unavailable()
    with pytest.raises(
        ConfigError, match=f"--transports rdma: transport rdma unavailable: {reason}"
    ):
        StoreSettings(transports="rdma").validate()


@pytest.mark.parametrize("engine", ["vllm", "emulated"])
def test_rdma_without_a_device_stops_a_worker_at_start(engine):
    reason = _rdma_unavailable()
    with pytest.raises(
        ConfigError, match=f"--kv-transports shm,rdma: transport rdma unavailable: {reason}"
    ):
        EngineSettings(engine=engine, kv_transports="shm,rdma").validate()
