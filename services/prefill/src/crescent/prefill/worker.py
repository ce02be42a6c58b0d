"""Prefill worker: a FIFO of jobs in front of one engine.

The queue's predicted drain time is what the conductor needs to estimate T_queue, so the
worker keeps each queued job's predicted prefill time and publishes their sum.
"""

from __future__ import annotations

import asyncio
import logging
import time

from crescent.common.errors import RecoverableError
from crescent.common.messages import InstanceInfo, InstanceLoad, PrefillJob, PrefillResult
from crescent.common.service import Runtime
from crescent.common.tracing import tracer
from crescent.engine.emulated import EmulatedPrefillEngine
from crescent.engine.settings import EngineSettings

log = logging.getLogger(__name__)


class JobRejected(RecoverableError):
    """A job this instance will not run (wrong model, too long)."""


class PrefillWorker:
    role = "prefill"

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.engine = EmulatedPrefillEngine(settings.cost_model())
        self._predicted_s: dict[str, float] = {}  # queued or running job → predicted prefill time
        self._turn = asyncio.Lock()  # FIFO: asyncio.Lock wakes waiters in arrival order
        self._runtime: Runtime | None = None

    async def start(self, runtime: Runtime) -> None:
        self._runtime = runtime
        await runtime.bus.serve(runtime.subjects.prefill_job(runtime.instance_id), PrefillJob, self.run_job)

    def instance_info(self) -> InstanceInfo:
        return InstanceInfo(role=self.role, instance_id=self._runtime.instance_id, node=self.settings.node,
                            model=self.settings.model, http_url=self._runtime.http_url,
                            max_model_len=self.settings.max_model_len, started_at=time.time())

    def health(self) -> dict:
        return {"num_queued": len(self._predicted_s)}

    def load(self) -> InstanceLoad:
        return InstanceLoad(role=self.role, instance_id=self._runtime.instance_id, node=self.settings.node,
                            sent_at=time.time(), period_s=self.settings.telemetry_period_s,
                            num_queued=len(self._predicted_s), queue_time_s=sum(self._predicted_s.values()))

    async def run_job(self, job: PrefillJob) -> PrefillResult:
        if job.model != self.settings.model:
            raise JobRejected(f"this instance serves {self.settings.model!r}, not {job.model!r}")
        if not 0 < len(job.token_ids) <= self.settings.max_model_len:
            raise JobRejected(f"prompt of {len(job.token_ids)} tokens is outside 1..{self.settings.max_model_len}")
        self._predicted_s[job.request_id] = self.engine.predict_s(len(job.token_ids))
        enqueued = time.monotonic()
        try:
            with tracer().start_as_current_span("prefill.queue") as queue_span:
                queue_span.set_attribute("crescent.request_id", job.request_id)
                await self._turn.acquire()
            try:
                started = time.monotonic()
                with tracer().start_as_current_span("prefill.compute") as span:
                    span.set_attribute("crescent.num_prompt_tokens", len(job.token_ids))
                    output = await self.engine.prefill(job.token_ids)
                    span.set_attribute("crescent.num_computed_tokens", output.num_computed_tokens)
            finally:
                self._turn.release()
        finally:
            self._predicted_s.pop(job.request_id, None)
        return PrefillResult(request_id=job.request_id, first_token=output.first_token,
                             num_computed_tokens=output.num_computed_tokens,
                             num_cached_tokens=output.num_cached_tokens,
                             queue_s=started - enqueued, compute_s=time.monotonic() - started)

    async def drain(self) -> None:
        """Jobs already accepted finish: the bus drain waits for their handlers."""
