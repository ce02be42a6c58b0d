"""CrescentConnector: vLLM's KV connector (KVConnectorBase_V1) backed by Crescent's stores.

Scheduler side (engine-core thread): `get_num_new_matched_tokens` asks this node's store how
many leading blocks of the prompt it holds. It never asks another node: the conductor decides
where a prefix comes from, and a prefix it planned to pull is in this node's store before the
request reaches vLLM. The plan of each step (what to load, which new full blocks to save
where) travels to the worker side in CrescentMetadata.

Worker side (same process, inside the forward pass): loads pin their blocks once and read
them layer by layer on the bridge loop, so `wait_for_layer_load(i)` waits only for layer i;
`save_kv_layer(i)` only snapshots layer i of every newly completed block and hands it to the
bridge, which writes it into each target store (the decode node's and this node's) while the
model computes on; commits follow the step. `wait_for_save` waits for nothing: decode, which
reads the blocks right after the first token, has its store wait for those still being
written (saver.py). A decode worker loads asynchronously (ConnectorConfig.load_async): vLLM
holds the new request back while its KV is read and steps the running requests meanwhile;
`get_finished` hands the request back once its blocks are in. A block that is missing or
fails is reported to vLLM (invalid block ids) and
recomputed; a failed save only means the block is not stored. Every wait has a deadline.

Store block layout: layer-major, `block_size / vllm_block_size` vLLM blocks per layer slice
(ConnectorRuntime.vllm_blocks_per_block), each vLLM block as vLLM's per-layer view holds it
([heads, tokens, 2·head_dim] on CPU).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from crescent.common.logs import setup_logging
from crescent.common.tracing import setup_tracing
from crescent.engine.kv_store import BlockOps, BridgeConfig, SharedBridges
from crescent.engine.vllm.events import EventLog
from crescent.engine.vllm.parent_watch import exit_with_parent
from crescent.engine.vllm.plan import (
    PARAM_LOAD,
    PARAM_PLANNED,
    PARAM_SAVE_TO,
    PARAM_TRACE,
    ConnectorConfig,
    CrescentMetadata,
)
from crescent.engine.vllm.runtime import ConnectorRuntime
from crescent.engine.vllm.scheduler_side import SchedulerSide
from crescent.engine.vllm.worker_side import WorkerSide

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

__all__ = [
    "PARAM_LOAD",
    "PARAM_PLANNED",
    "PARAM_SAVE_TO",
    "PARAM_TRACE",
    "CrescentConnector",
    "CrescentMetadata",
]


def log_like_the_worker(config: ConnectorConfig) -> None:
    """In an engine core child process nobody set up logging: the connector's warnings would
    reach stderr as bare messages, without time, request or error. Log there as the worker
    does; a process that has handlers (the worker itself) is left alone."""
    if not logging.getLogger().handlers:
        setup_logging(
            config.role,
            config.instance_id or f"{config.role}-kv",
            config.log_level,
            config.log_format,
        )


class CrescentConnector(KVConnectorBase_V1):
    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig | None = None,
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        exit_with_parent()  # an engine core child outlives a worker killed by SIGKILL otherwise
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        config = ConnectorConfig.from_extra(extra)
        log_like_the_worker(config)
        vllm_block_size = vllm_config.cache_config.block_size
        if config.block_size % vllm_block_size:
            raise ValueError(
                f"Crescent block size {config.block_size} is not a multiple of vLLM's "
                f"{vllm_block_size}"
            )
        # vLLM builds this connector once per role; only the worker side moves bytes, and where
        # both roles share a process they share its bridge (kv_store.SharedBridges).
        bridge = SharedBridges.acquire(
            BridgeConfig(
                nats_url=config.nats_url,
                etcd_url=config.etcd_url,
                cluster=config.cluster,
                node=config.node,
                name=f"{config.node}-{config.role}-kv",
                timeout_s=config.timeout_s,
                use_mapping=config.use_mapping,
                transports=config.transports,
                has_data_plane=role == KVConnectorRole.WORKER,
            )
        )
        # vLLM's engine core may run in a child process: give it its own exporter, so the
        # connector's spans (load_kv, kv.transfer) join the request's trace from there.
        self.tracer_provider = setup_tracing(f"{config.role}-kv", config.node)
        self.runtime = ConnectorRuntime(
            config=config,
            bridge=bridge,
            ops=BlockOps(bridge, config.cluster, config.model, config.timeout_s),
            events=EventLog(config.event_log),
            tracer=self.tracer_provider.get_tracer("crescent"),
            vllm_block_size=vllm_block_size,
            vllm_blocks_per_block=config.block_size // vllm_block_size,
        )
        self._scheduler = SchedulerSide(self.runtime) if role == KVConnectorRole.SCHEDULER else None
        self._worker = WorkerSide(self.runtime) if role == KVConnectorRole.WORKER else None

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.saver.close()
        SharedBridges.release(self.runtime.bridge)
        self.runtime.events.close()
        self.tracer_provider.shutdown()

    # scheduler side ------------------------------------------------------------------------
    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self._scheduler.num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self._scheduler.after_alloc(request, list(blocks.get_block_ids()[0]), num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return self._scheduler.build_meta(scheduler_output)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self._scheduler.on_load_errors(connector_output.invalid_block_ids)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Saves snapshot their layers inside the step, so the blocks may be freed now."""
        self._scheduler.forget(request.request_id)
        return False, None

    # worker side ---------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._worker.register(kv_caches)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        self._worker.begin_step(connector_metadata)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        self._worker.start_loads()

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._worker.wait_layer(layer_name)

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        self._worker.save_layer(layer_name, kv_layer)

    def wait_for_save(self) -> None:
        self._worker.finish_saves()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """(nothing sends asynchronously, the requests whose asynchronous loads ended)."""
        return None, self._worker.finished_loads()

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.take_invalid_block_ids()
