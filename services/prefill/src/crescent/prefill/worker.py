"""Prefill worker: a FIFO of jobs in front of one engine (compute_gate.py).

The queue's predicted drain time is what the conductor needs to estimate T_queue, so the
worker keeps each queued job's predicted prefill time and publishes their sum, with how long
the running job has been computing and that job's own prediction (the conductor, which knows
how much slower or faster than its profile this engine runs, works out what is left).
Predictions use the cost profile this worker publishes in etcd (costs/prefill/<id>, measured
at start or loaded: crescent.engine.costs), the same one the conductor prices this instance
with, and count the prefix its node's store holds once the planned pull is done (until then,
the whole prompt).

The FIFO covers compute only: the etcd lookup of the decode node, the planned prefix pull
and (emulated engine) the store lookup happen while the job waits for its turn, and the saves
after it, so a slow or dead store never holds up the jobs behind. With vLLM the store lookup
only prices the job (the connector decides what is loaded), so it runs beside the job's wait
and compute, and a job that finds the engine free starts at once; a gate that admits by
uncached tokens (`--prefill-batch-tokens`) waits for it. A job whose conductor cancels
it (the client left, or the request moved on) stops where it is. A job's outcome is kept a
while after it ends (outcomes.py), for a conductor whose NATS connection dropped before the
reply came to ask for it instead of computing the prompt again elsewhere.

With the vllm engine, each job's full prompt blocks go to the store on the decode instance's
node (and this node's, for later reuse), layer by layer while the prompt computes.

A job may carry its decode's start (PrefillJob.decode_start): once the first token is out and
the decode node holds the KV, the worker sends the start, that token filled in, to the decode
instance in the same socket write as the result, so decoding starts one NATS hop sooner than
if the conductor relayed it. The start's reply subject is the conductor's
(Subjects.start_reply): the decode answers the conductor, which moves the request when no
answer comes within its start deadline. A first token that ends the answer
(PrefillJob.ends_on_first) sends no start: no decode follows it.
"""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec

from crescent.common.cluster_config import ConfigFollower
from crescent.common.codec import decode, encode
from crescent.common.cost_profile import CostProfile
from crescent.common.errors import MessageError, RecoverableError
from crescent.common.hashing import block_hashes
from crescent.common.messages import (
    Ack,
    InstanceInfo,
    InstanceLoad,
    PrefillCancel,
    PrefillJob,
    PrefillResult,
    PrefillResultAsk,
)
from crescent.common.payload import num_fitting
from crescent.common.received import ReceivedAssignments
from crescent.common.service import Runtime, until_drained
from crescent.common.store_messages import (
    REPLICATE_ON_DEMAND,
    LookupBlocks,
    LookupReply,
    ReplicateBlocks,
    ReplicateReply,
)
from crescent.common.telemetry import Ewma
from crescent.common.tracing import tracer
from crescent.engine.base import InvalidRequestError
from crescent.engine.costs import emulated_profile, resolve_profile
from crescent.engine.emulated import unsupported
from crescent.engine.emulated_kv import EmulatedKv
from crescent.engine.factory import build_engine
from crescent.engine.settings import EngineSettings
from crescent.engine.store_check import check_store_block_bytes
from crescent.prefill.compute_gate import ComputeGate
from crescent.prefill.outcomes import JobOutcomes
from crescent.storeclient.client import ClientConfig, StoreClient
from crescent.transfer import TransferConfig

log = logging.getLogger(__name__)

RESULT_MEMORY_S = 60.0  # how long a finished job's result can be asked for again
RESULT_MEMORY_BYTES = 256 << 20  # and what they may hold together (prompt logprobs)


class JobRejected(RecoverableError):
    """A job this instance will not run (wrong model, too long)."""


class PrefillWorker:
    role = "prefill"

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.engine = build_engine(settings, self.role)
        # Replaced at start by the profile this worker publishes; until then its emulated model.
        self.profile: CostProfile = emulated_profile(settings.cost_model(), settings.model_name)
        self._predicted_s: dict[str, float] = {}  # queued or running job → predicted prefill time
        self._computing_since: dict[str, float] = {}  # jobs inside the engine → monotonic start
        self._jobs: dict[str, asyncio.Task] = {}  # queued or running job → the task running it
        self._outcomes = JobOutcomes(RESULT_MEMORY_S, RESULT_MEMORY_BYTES)
        self.received = ReceivedAssignments()  # which conductors' jobs and cancels load() counts
        # one job at a time unless --prefill-batch-tokens lets vLLM batch several; emulated: one
        self._gate = ComputeGate(settings.prefill_batch_tokens if self.is_vllm else 0)
        self.recent_ttft = Ewma()  # measured queue + compute time of finished jobs
        self._decode_nodes: dict[str, str] = {}
        self._runtime: Runtime | None = None
        self._store: StoreClient | None = None  # the emulated engine's KV traffic
        self._is_draining = False  # shutting down: new jobs are refused

    @property
    def is_vllm(self) -> bool:
        return self.settings.engine == "vllm"

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len if self.is_vllm else self.settings.max_model_len

    async def start(self, runtime: Runtime) -> None:
        self._runtime = runtime
        config = ConfigFollower(
            runtime.etcd,
            runtime.keys,
            f"prefill {runtime.instance_id}",
            {"model": self.settings.model_name, "block_size": self.settings.block_size},
        )
        await config.start()
        runtime.tasks.spawn("cluster-config", config.run())
        if self.is_vllm:
            if self.settings.vllm_connector:
                await check_store_block_bytes(
                    runtime.bus,
                    runtime.subjects,
                    self.settings.node,
                    self.settings.model_name,
                    self.engine.store_block_bytes,
                    self.settings.kv_timeout_s,
                )
            await self.engine.start()
            self.profile = await resolve_profile(self.settings, self.engine)
        else:
            self.profile = await resolve_profile(self.settings, self.engine)
            self._store = StoreClient(
                runtime.bus,
                runtime.etcd,
                self.settings.cluster,
                ClientConfig(
                    node=self.settings.node,
                    timeout_s=self.settings.kv_timeout_s,
                    staging_bytes=16 << 20,
                    use_mapping=self.settings.kv_use_mapping,
                    transfer=TransferConfig(
                        node=self.settings.node, transports=self.settings.kv_transport_kinds
                    ),
                ),
            )
            await self._store.start()
            self._store.export_transfer_metrics("prefill-kv")
            self.engine.kv = EmulatedKv(
                self._store, self.settings.model_name, self.settings.block_size, self.settings.node
            )
        await runtime.leased.put(
            runtime.keys.cost(self.role, runtime.instance_id), encode(self.profile)
        )
        log.info(
            "cost profile published",
            extra={"source": self.profile.source, "prefill": str(self.profile.prefill)},
        )
        # Jobs are served last: once one is answered, its cancel has a responder too.
        await runtime.bus.serve(
            runtime.subjects.prefill_result(runtime.instance_id), PrefillResultAsk, self.result
        )
        await runtime.bus.serve(
            runtime.subjects.prefill_cancel(runtime.instance_id), PrefillCancel, self.cancel
        )
        await runtime.bus.serve(
            runtime.subjects.prefill_job(runtime.instance_id), PrefillJob, self.run_job
        )

    def instance_info(self) -> InstanceInfo:
        return InstanceInfo(
            role=self.role,
            instance_id=self._runtime.instance_id,
            node=self.settings.node,
            model=self.settings.model_name,
            http_url=self._runtime.http_url,
            max_model_len=self.max_model_len,
            started_at=time.time(),
            engine=self.settings.engine,
        )

    def health(self) -> dict:
        return {"num_queued": len(self._predicted_s), "engine": self.settings.engine}

    def load(self) -> InstanceLoad:
        running_s, running_predicted_s = self._running()
        return InstanceLoad(
            role=self.role,
            instance_id=self._runtime.instance_id,
            node=self.settings.node,
            sent_at=time.time(),
            period_s=self.settings.telemetry_period_s,
            num_queued=len(self._predicted_s),
            queue_time_s=sum(self._predicted_s.values()),
            running_s=running_s,
            running_predicted_s=running_predicted_s,
            recent_ttft_s=self.recent_ttft.value,
            received=self.received.latest(time.monotonic()),
        )

    def _running(self) -> tuple[float, float]:
        """How long the oldest job inside the engine has computed, and its predicted time
        (0, 0: none)."""
        if not self._computing_since:
            return 0.0, 0.0
        request_id = min(self._computing_since, key=self._computing_since.__getitem__)
        running_s = time.monotonic() - self._computing_since[request_id]
        return running_s, self._predicted_s.get(request_id, 0.0)

    async def _decode_node(self, job: PrefillJob, timeout_s: float) -> str:
        """The node of the job's decode instance: from the job, else its registry entry."""
        if job.decode_node or not job.decode_instance:
            return job.decode_node
        if job.decode_instance not in self._decode_nodes:
            key = self._runtime.keys.instance("decode", job.decode_instance)
            try:
                async with asyncio.timeout(timeout_s):
                    entry = await self._runtime.etcd.get(key.encode())
            except (TimeoutError, OSError) as exc:
                log.warning(
                    "registry unreachable; the decode node gets no KV",
                    extra={"decode": job.decode_instance, "error": repr(exc)},
                )
                return ""
            if entry is None:
                log.warning(
                    "decode instance not registered; its node gets no KV",
                    extra={"decode": job.decode_instance},
                )
                return ""
            try:
                self._decode_nodes[job.decode_instance] = decode(entry.value, InstanceInfo).node
            except MessageError as exc:
                log.warning(
                    "bad registry entry", extra={"decode": job.decode_instance, "error": str(exc)}
                )
                return ""
        return self._decode_nodes[job.decode_instance]

    async def run_job(self, job: PrefillJob) -> PrefillResult:
        """Run the job, its outcome kept for a conductor that asks for it again (result)."""
        if job.request_id in self._jobs:  # its cancel would stop either, its engine id clash
            raise JobRejected(f"a job {job.request_id} is already running here")
        outcome = self._outcomes.open(job.request_id)
        try:
            result = await self._run_job(job)
        except asyncio.CancelledError:
            outcome.cancel()
            raise
        except Exception as exc:
            outcome.set_exception(exc)
            raise
        else:
            outcome.set_result(result)
        finally:
            self._outcomes.end(job.request_id, time.monotonic())
        return self._part(result, 0)

    async def result(self, ask: PrefillResultAsk) -> PrefillResult:
        """A job's result (or its error) for a conductor whose NATS connection dropped while it
        waited for the reply, within ask.wait_s: the reply may have been lost. Also the rest
        of a result's prompt logprobs, from ask.prompt_logprobs_from on."""
        result = await self._outcomes.result(ask.request_id, ask.wait_s, time.monotonic())
        return self._part(result, ask.prompt_logprobs_from)

    def _part(self, result: PrefillResult, start: int) -> PrefillResult:
        """`result` with as many of its prompt logprobs from `start` on as fit one message:
        a long prompt's, with many alternatives a token, can outgrow the server's limit."""
        if not start and not result.prompt_logprobs:
            return result
        rest = result.prompt_logprobs[start:]
        shell = msgspec.structs.replace(result, prompt_logprobs=[])
        num = num_fitting(shell, rest, self._runtime.bus.max_payload)
        return msgspec.structs.replace(
            result, prompt_logprobs=rest[:num], num_prompt_logprobs_left=len(rest) - num
        )

    async def _run_job(self, job: PrefillJob) -> PrefillResult:
        if self._is_draining:
            raise JobRejected(
                f"prefill {self._runtime.instance_id} is draining: it takes no new jobs"
            )
        if job.model != self.settings.model_name:
            raise JobRejected(
                f"this instance serves {self.settings.model_name!r}, not {job.model!r}"
            )
        if not 0 < len(job.token_ids) <= self.max_model_len:
            raise JobRejected(
                f"prompt of {len(job.token_ids)} tokens is outside 1..{self.max_model_len}"
            )
        if job.block_size and job.block_size != self.settings.block_size:
            raise JobRejected(
                f"the job's blocks are {job.block_size} tokens, this instance stores "
                f"{self.settings.block_size}-token blocks: its prefix would never be found"
            )
        start = job.decode_start
        if start is not None and not (job.decode_instance and start.stream_owner):
            raise JobRejected("a job's decode start needs a decode instance and a stream owner")
        if not self.is_vllm and unsupported(job.sampling):
            raise InvalidRequestError(
                f"the emulated engine cannot apply {', '.join(unsupported(job.sampling))}"
            )
        self._predicted_s[job.request_id] = self.profile.prefill_s(len(job.token_ids))
        self._jobs[job.request_id] = asyncio.current_task()
        enqueued = time.monotonic()
        self.received.note(job.conductor, job.assignment, enqueued)
        deadline = enqueued + (job.timeout_s or float("inf"))
        lookup: asyncio.Future[int] | None = None
        try:
            decode_node = await self._decode_node(job, self._remote_timeout_s(deadline))
            save_to = list(dict.fromkeys(n for n in (decode_node, self.settings.node) if n))
            pull_started = time.monotonic()
            await self._pull_prefix(job, self._remote_timeout_s(deadline))
            transfer_s = time.monotonic() - pull_started if job.pull_hashes else 0.0
            plan = None if self.is_vllm else await self.engine.plan(job.token_ids)
            if plan is not None:
                self._price(job, plan.num_cached)
            else:
                # Only the published queue time needs it (the connector decides the load), so
                # the job goes for its turn while the store answers, unless the gate admits by
                # uncached tokens.
                lookup = asyncio.ensure_future(
                    self._stored_prefix_tokens(job, self._remote_timeout_s(deadline))
                )
                lookup.add_done_callback(lambda done: self._priced(job, done))
            gate_num_cached = (
                plan.num_cached
                if plan is not None
                else (await lookup if self._gate.capacity_tokens else 0)
            )
            with tracer().start_as_current_span("prefill.queue") as queue_span:
                queue_span.set_attribute("crescent.request_id", job.request_id)
                await self._gate.enter(len(job.token_ids) - gate_num_cached)
            try:
                started = time.monotonic()
                self._computing_since[job.request_id] = started
                with tracer().start_as_current_span("prefill.compute") as span:
                    span.set_attribute("crescent.num_prompt_tokens", len(job.token_ids))
                    span.set_attribute("crescent.kv_targets", ",".join(save_to))
                    if plan is None:
                        output = await self.engine.prefill(
                            job.token_ids,
                            request_id=job.request_id,
                            sampling=job.sampling,
                            save_to=save_to,
                            planned_prefix_tokens=job.planned_prefix_tokens,
                        )
                    else:
                        output = await self.engine.compute(plan, job.sampling.logprobs)
                    span.set_attribute("crescent.num_computed_tokens", output.num_computed_tokens)
                    span.set_attribute("crescent.num_cached_tokens", output.num_cached_tokens)
            finally:
                del self._computing_since[job.request_id]
                self._gate.leave(len(job.token_ids) - gate_num_cached)
            if plan is not None:
                await self.engine.save(plan, save_to)
        finally:
            if lookup is not None:
                lookup.cancel()
            self._predicted_s.pop(job.request_id, None)
            self._jobs.pop(job.request_id, None)
        finished = time.monotonic()
        self.recent_ttft.add(finished - enqueued)
        # the decode node's store has the KV or is writing it: the decode can start now, unless
        # the answer has ended
        if start is not None and output.first_token not in job.ends_on_first:
            await self._runtime.bus.publish(
                self._runtime.subjects.decode_start(job.decode_instance),
                msgspec.structs.replace(
                    start, token_ids=job.token_ids, first_token=output.first_token
                ),
                reply=self._runtime.subjects.start_reply(start.request_id, start.stream_owner),
            )
        return PrefillResult(
            request_id=job.request_id,
            first_token=output.first_token,
            num_computed_tokens=output.num_computed_tokens,
            num_cached_tokens=output.num_cached_tokens,
            queue_s=started - enqueued,
            compute_s=finished - started,
            transfer_s=transfer_s,
            first_logprobs=output.first_logprobs,
            prompt_logprobs=output.prompt_logprobs,
        )

    async def cancel(self, cancel: PrefillCancel) -> Ack:
        """Stop a queued or running job: nobody waits for its result any more. Its predicted
        time leaves the published queue now, as the cancel's number enters `received`."""
        task = self._jobs.get(cancel.request_id)
        if task is not None:
            log.info("prefill cancelled", extra={"request_id": cancel.request_id})
            task.cancel()
            self._predicted_s.pop(cancel.request_id, None)
        self.received.note(cancel.conductor, cancel.assignment, time.monotonic())
        return Ack(request_id=cancel.request_id)

    def _remote_timeout_s(self, deadline: float) -> float:
        """A store or etcd call's deadline: kv_timeout_s, and never past the job's own deadline."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise JobRejected("the conductor's deadline for this job has passed")
        return min(self.settings.kv_timeout_s, remaining)

    def _priced(self, job: PrefillJob, lookup: asyncio.Future[int]) -> None:
        """The job's store lookup is done: price it, unless the lookup was stopped or broke."""
        if lookup.cancelled():
            return
        if lookup.exception() is not None:
            log.warning(
                "store lookup failed; the job stays priced in full",
                extra={"request_id": job.request_id, "error": repr(lookup.exception())},
            )
            return
        self._price(job, lookup.result())

    def _price(self, job: PrefillJob, num_cached: int) -> None:
        """The job's predicted compute, once the prefix its node's store holds is known."""
        if job.request_id in self._predicted_s:
            self._predicted_s[job.request_id] = self.profile.prefill_s(
                len(job.token_ids), num_cached
            )

    async def _stored_prefix_tokens(self, job: PrefillJob, timeout_s: float) -> int:
        """vllm: the prompt's prefix this node's store holds now (a planned pull has landed), in
        tokens, which the connector will load rather than compute; 0 when it cannot say."""
        if not self.settings.vllm_connector:
            return 0
        block_size = self.settings.block_size
        hashes = block_hashes(job.token_ids, block_size, self.settings.model_name)
        if not hashes:
            return 0
        try:
            reply = await self._runtime.bus.request(
                self._runtime.subjects.store_ctl(self.settings.node),
                LookupBlocks(model=job.model, hashes=hashes),
                LookupReply,
                timeout_s,
            )
        except RecoverableError:
            return 0
        return min(len(reply.tiers) * block_size, len(job.token_ids) - 1)

    async def _pull_prefix(self, job: PrefillJob, timeout_s: float) -> None:
        """The conductor's transfer plan: copy the prefix blocks this node lacks from the node
        that has them into this node's store, where the engine then finds them. A failed pull
        only means those blocks are computed instead."""
        if not (job.source_node and job.pull_hashes):
            return
        with tracer().start_as_current_span("prefill.load_kv") as span:
            span.set_attribute("crescent.source_node", job.source_node)
            span.set_attribute("crescent.num_blocks", len(job.pull_hashes))
            request = ReplicateBlocks(
                model=job.model,
                hashes=job.pull_hashes,
                source_node=job.source_node,
                reason=REPLICATE_ON_DEMAND,
            )
            try:
                await self._runtime.bus.request(
                    self._runtime.subjects.store_ctl(self.settings.node),
                    request,
                    ReplicateReply,
                    timeout_s,
                )
            except RecoverableError as exc:
                span.set_attribute("crescent.error", str(exc))
                log.warning(
                    "prefix pull failed; computing it instead",
                    extra={"request_id": job.request_id, "error": str(exc)},
                )

    async def finish_inflight(self) -> None:
        """New jobs are refused from now on (their conductor places them elsewhere); the jobs
        already accepted finish, or drain_timeout_s passes. The instance is still registered,
        so their conductors wait for them rather than moving them."""
        self._is_draining = True
        if self._jobs:
            log.info("draining", extra={"num_jobs": len(self._jobs)})
        left = await until_drained(lambda: len(self._jobs), self.settings.drain_timeout_s)
        if left:
            log.warning("drain deadline passed; cancelling jobs left", extra={"num_jobs": left})
            for task in list(self._jobs.values()):
                task.cancel()

    async def drain(self) -> None:
        """After the instance left the registry: close the engine and its store connection."""
        if self.is_vllm:
            await self.engine.close()
        elif self._store is not None:
            await self.engine.kv.finish_saves(self.settings.kv_timeout_s)
            await self._store.close()
