"""Store settings."""

from __future__ import annotations

from dataclasses import dataclass

from crescent.common.config import CommonSettings, setting
from crescent.common.errors import ConfigError
from crescent.storeclient.transport_choice import transport_choice


@dataclass
class StoreSettings(CommonSettings):
    """Settings of a node's store: tier sizes, block slot size, data-plane port."""

    dram_bytes: int = setting(512 << 20, "DRAM tier: bytes of the shared-memory pool")
    block_bytes: int = setting(1 << 20, "bytes of one block slot (a KV block with all its layers)")
    ssd_path: str = setting("", "file of the SSD tier (empty: no SSD tier)")
    ssd_bytes: int = setting(0, "SSD tier: bytes of the slot file")
    transfer_port: int = setting(0, "tcp port of the data plane (0 picks a free port)")
    transfer_timeout_s: float = setting(
        30.0, "deadline of one data-plane batch (replication pulls)"
    )
    transports: str = setting(
        "",
        "data-plane transports this store serves and pulls with, in order of "
        "preference (shm, tcp, rdma; e.g. tcp); empty: every transport that runs here",
    )

    def validate(self) -> None:
        super().validate()
        if self.block_bytes < 1 or self.dram_bytes < self.block_bytes:
            raise ConfigError(
                f"dram_bytes ({self.dram_bytes}) must hold at least one block of {self.block_bytes}"
            )
        transport_choice("transports", self.transports)
        if self.ssd_bytes and not self.ssd_path:
            raise ConfigError("ssd_bytes needs ssd_path")
        if self.ssd_path and self.ssd_bytes < self.block_bytes:
            raise ConfigError(
                f"ssd_bytes ({self.ssd_bytes}) must hold at least one block of {self.block_bytes}"
            )
