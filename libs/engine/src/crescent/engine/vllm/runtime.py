"""What every part of CrescentConnector works with: its settings, the store bridge and block
operations, the event log, the tracer and the block geometry. The connector builds one and
hands it to its scheduler side, worker side and saver, so none of them needs the connector
(and the modules import in one direction: connector → sides → saver → runtime)."""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.trace import Tracer

from crescent.engine.kv_store import BlockOps, StoreBridge
from crescent.engine.vllm.events import EventLog
from crescent.engine.vllm.plan import ConnectorConfig


@dataclass(frozen=True)
class ConnectorRuntime:
    config: ConnectorConfig
    bridge: StoreBridge  # shared by every connector of this process (kv_store.SharedBridges)
    ops: BlockOps
    events: EventLog
    tracer: Tracer
    vllm_block_size: int  # tokens of one vLLM KV block
    vllm_blocks_per_block: (
        int  # vLLM blocks in one store block: config.block_size / vllm_block_size
    )
