"""What the scheduler side of CrescentConnector tells its worker side each step (the plan),
and the connector's configuration (vLLM's kv_connector_extra_config)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

PARAM_LOAD = "crescent_load"  # kv_transfer_params: False skips the store lookup
# kv_transfer_params: prompt tokens the conductor planned this node's store to supply
# (PrefillJob.planned_prefix_tokens); the store is asked only when vLLM's cache holds fewer
PARAM_PLANNED = "crescent_planned_prefix_tokens"
# kv_transfer_params: nodes whose stores get the prompt's blocks (the decode node's first, which
# decode reads right after the first token), written and committed off the request path.
PARAM_SAVE_TO = "crescent_save_to"
PARAM_TRACE = "crescent_trace"  # kv_transfer_params: the request's W3C trace context (traceparent)


@dataclass
class ConnectorConfig:
    """From kv_connector_extra_config (see crescent.engine.vllm.engine.connector_extra_config)."""

    nats_url: str
    etcd_url: str
    cluster: str
    node: str
    model: str
    block_size: int
    role: str = "prefill"
    timeout_s: float = 10.0
    # the longest the engine's own thread waits on the store in a step: a lookup (on decode, half
    # of it for blocks still being written), a load inside a step (EngineSettings.kv_engine_wait_s)
    engine_wait_s: float = 2.0
    event_log: str = ""
    use_mapping: bool = True
    transports: str = ""  # the data plane's transports (EngineSettings.kv_transports)
    # loads run beside the engine's steps, the request waiting in WAITING_FOR_REMOTE_KVS
    # (decode: its running requests are not held by a new request's load)
    load_async: bool = False
    # how the worker logs, for an engine core in a child process, whose root logger has no
    # handler (Python would print a warning's message alone, without its fields)
    instance_id: str = ""
    log_level: str = "INFO"
    log_format: str = "json"
    # testing only: "evict_after_lookup" drops block 1 between lookup and load;
    # "delay_commits" starts every commit 0.5 s late (saver.py);
    # "slow_load" starts every load 2 s late (worker_side.py)
    fault: str = ""

    @classmethod
    def from_extra(cls, extra: dict[str, Any]) -> ConnectorConfig:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in extra.items() if k in names})


@dataclass
class LoadSpec:
    """Fill vLLM blocks from a run of store blocks of a request's prompt, read from this node's
    store."""

    request_id: str
    hashes: list[bytes]  # the store blocks to read, in prompt order
    fills: list[tuple[int, int, int]]  # (index into hashes, sub-block within it, vLLM block id)
    trace: dict[str, str] = field(default_factory=dict)  # the request's trace context, for spans
    is_async: bool = False  # filled once read, beside the steps (ConnectorConfig.load_async)


@dataclass
class SaveSpec:
    request_id: str
    hashes: list[bytes]
    vllm_block_ids: list[int]  # vllm_blocks_per_block per store block, in order
    targets: list[str]
    trace: dict[str, str] = field(default_factory=dict)


@dataclass
class CrescentMetadata(KVConnectorMetadata):
    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)
