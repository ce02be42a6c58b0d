"""A disaggregated cluster in simulation, scheduled by the conductor's own code.

The conductor side is not re-implemented: a real `Scheduler` (conductor/scheduler.py) over a
real `ClusterView` (conductor/cluster_view.py), on the simulator's clock. Instances register
with the view as they would through etcd and publish `InstanceLoad` telemetry every period (with
an optional delay), so the policy sees the same stale-plus-own-assignments picture as in a real
cluster. Stores report each block they start or stop holding to `Scheduler.apply_block_event`,
as etcd's watch does. Each request is placed the way conductor/flow.py places it (schedule →
record → reserve the decode instance, or forget it and ask again without that instance), and
the hot-spot pass runs `Scheduler.hot_spot_orders` every period. The simulator only carries out
what the policy decided: queues, pulls, compute, KV saves and decode batches.

With a P/D ratio controller (`SimConfig.ratio`), instances come and go as it decides (see
autoscale.py); a new instance gets a node and a store of its own, a drained one leaves the
registry once it holds no work (its node's store stays, with the blocks it holds).
"""

from __future__ import annotations

from crescent.bench.sim.autoscale import SimRatio
from crescent.bench.sim.config import SimConfig
from crescent.bench.sim.events import EventLoop
from crescent.bench.sim.instances import DecodeInstance, PrefillInstance, take_in
from crescent.bench.sim.network import Network
from crescent.bench.sim.request import SimRequest, Status
from crescent.bench.sim.store import NodeStore
from crescent.bench.trace import TRACE_BLOCK_TOKENS
from crescent.common.bounds import MAX_SEQUENCE_TOKENS
from crescent.common.codec import encode
from crescent.common.etcd import MirrorEvent
from crescent.common.messages import InstanceInfo
from crescent.conductor.cluster_view import ClusterView
from crescent.conductor.policy import Rejection, ScheduleRequest
from crescent.conductor.ratio import InstanceCounts
from crescent.conductor.scheduler import Scheduler
from crescent.conductor.settings import ConductorSettings

MODEL = "sim-model"
ROLES = ("prefill", "decode")
_BLOCK_KEY = f"/crescent/sim/blocks/{MODEL}/"


def conductor_settings(config: SimConfig) -> ConductorSettings:
    """The conductor's flags for this cluster: its policy, admission (the baseline runs the
    conductor without one) and SLOs, and the cost model it predicts with."""
    dims = config.model_dims
    return ConductorSettings(
        policy=config.policy,
        admission="none" if config.admission == "baseline" else config.admission,
        ttft_slo_s=config.ttft_slo_s,
        tbt_slo_s=config.tbt_slo_s,
        block_size=TRACE_BLOCK_TOKENS,
        kv_bytes_per_block=int(TRACE_BLOCK_TOKENS * config.kv_bytes_per_token()),
        kvcache_balancing_threshold=config.kvcache_balancing_threshold,
        prefill_model=str(config.profile or ""),
        local_prefill=config.local_prefill,
        hot_spot_period_s=config.hot_spot_period_s,
        seed=config.seed,
        emulated_layers=dims.num_layers,
        emulated_hidden_size=dims.hidden_size,
        emulated_gqa=dims.gqa,
        emulated_tflops=config.tflops,
        emulated_memory_gbps=config.memory_gbps,
        telemetry_period_s=config.telemetry_period_s,
    )


class DisaggregatedCluster:
    def __init__(self, config: SimConfig, loop: EventLoop) -> None:
        self.config = config
        self.loop = loop
        self.costs = config.costs()
        self.decode_step_s = self.costs.decode_step_s
        self.block_bytes = TRACE_BLOCK_TOKENS * self.costs.kv_bytes_per_token
        self.view = ClusterView(clock=loop.clock)
        self.scheduler = Scheduler(conductor_settings(config), self.view, loop.clock)
        self.network = Network(config.nic_gbps * 1e9 / 8)
        self.replicas: dict[bytes, int] = {}
        self.max_replicas = 0
        self.num_replication_orders = 0
        self.prefills = {
            f"prefill-{i}": PrefillInstance(f"prefill-{i}", f"p{i}")
            for i in range(config.num_prefill)
        }
        self.decodes = {
            f"decode-{i}": DecodeInstance(f"decode-{i}", f"d{i}", config.kv_capacity_tokens())
            for i in range(config.num_decode)
        }
        capacity = (
            None
            if config.cache_tokens_per_node is None
            else config.cache_tokens_per_node // TRACE_BLOCK_TOKENS
        )
        ssd = config.ssd_tokens_per_node // TRACE_BLOCK_TOKENS
        nodes = [p.node for p in self.prefills.values()] + [d.node for d in self.decodes.values()]
        self.stores = {
            node: NodeStore(node, capacity, ssd, self._on_block_added, self._on_block_removed)
            for node in nodes
        }
        self.num_open = 0
        self._num_made = {"prefill": config.num_prefill, "decode": config.num_decode}
        self._num_starting = {"prefill": 0, "decode": 0}
        self.ratio = (
            None
            if config.ratio is None
            else SimRatio(
                config.ratio,
                config.ttft_slo_s,
                config.tbt_slo_s,
                InstanceCounts(config.num_prefill, config.num_decode),
            )
        )
        self.imbalance_samples: list[float] = []
        self.load_timeline: list[
            tuple[float, float, float]
        ] = []  # (time, prefill load, decode load)
        for instance in [*self.prefills.values(), *self.decodes.values()]:
            self._register(instance)

    # -- the conductor's inputs: registry, telemetry, block metadata --------------------------

    def _register(self, instance: PrefillInstance | DecodeInstance) -> None:
        role = "prefill" if isinstance(instance, PrefillInstance) else "decode"
        capacity = instance.kv_capacity_tokens if role == "decode" else 0
        info = InstanceInfo(
            role=role,
            instance_id=instance.instance_id,
            node=instance.node,
            model=MODEL,
            max_model_len=MAX_SEQUENCE_TOKENS,
            kv_capacity_tokens=capacity,
        )
        self.scheduler.apply_registry_event(
            MirrorEvent(f"/crescent/sim/instances/{role}/{instance.instance_id}", encode(info))
        )

    def _on_block_added(self, block: bytes, node: str) -> None:
        self.scheduler.apply_block_event(MirrorEvent(f"{_BLOCK_KEY}{block.hex()}/{node}", b"1"))
        count = self.replicas.get(block, 0) + 1
        self.replicas[block] = count
        self.max_replicas = max(self.max_replicas, count)

    def _on_block_removed(self, block: bytes, node: str) -> None:
        self.scheduler.apply_block_event(MirrorEvent(f"{_BLOCK_KEY}{block.hex()}/{node}", None))
        count = self.replicas[block] - 1
        if count:
            self.replicas[block] = count
        else:
            del self.replicas[block]

    def start(self) -> None:
        """Telemetry and hot-spot ticks; they stop once every request has finished."""
        period = self.config.telemetry_period_s
        instances = [*self.prefills.values(), *self.decodes.values()]
        for i, instance in enumerate(instances):
            self.loop.at(period * i / len(instances), self._telemetry, instance)
        if self.config.hot_spot_period_s > 0 and self.config.cache_scope == "global":
            self.loop.at(self.config.hot_spot_period_s, self._hot_spot)
        self.loop.at(period, self._sample_imbalance)
        if self.ratio is not None:
            self.loop.at(self.config.ratio_window_s, self._ratio_tick)

    def _telemetry(self, instance: PrefillInstance | DecodeInstance) -> None:
        if (
            instance.is_draining
            and not instance.holds_work
            and instance.drain_announced_s is not None
            and self.loop.now - instance.drain_announced_s > self.config.telemetry_delay_s
        ):
            self._retire(instance)  # the conductor knows it takes no work: it can go
            return
        load = instance.load(self.loop.now, self.config.telemetry_period_s)
        if instance.is_draining and instance.drain_announced_s is None:
            instance.drain_announced_s = self.loop.now
        if self.config.telemetry_delay_s > 0:
            self.loop.after(self.config.telemetry_delay_s, self.scheduler.apply_load, load)
        else:
            self.scheduler.apply_load(load)
        if self.num_open:
            self.loop.after(self.config.telemetry_period_s, self._telemetry, instance)

    # -- the P/D ratio controller's actions ------------------------------------------------------

    def _instances(self, role: str) -> dict[str, PrefillInstance | DecodeInstance]:
        return self.prefills if role == "prefill" else self.decodes

    def serving(self) -> InstanceCounts:
        """Instances that take work (not draining, not still starting)."""
        return InstanceCounts(
            *(sum(not i.is_draining for i in self._instances(role).values()) for role in ROLES)
        )

    def _ratio_tick(self, _: object) -> None:
        serving = self.serving()
        desired = self.ratio.step(self.loop.now, serving)
        for role in ROLES:
            planned = serving.of(role) + self._num_starting[role]
            for _ in range(desired.of(role) - planned):
                self._num_starting[role] += 1
                self.loop.after(self.config.instance_start_s, self._bring_up, role)
            for _ in range(planned - desired.of(role)):
                self._drain_one(role)
        if self.num_open:
            self.loop.after(self.config.ratio_window_s, self._ratio_tick)

    def _bring_up(self, role: str) -> None:
        self._num_starting[role] -= 1
        index = self._num_made[role]
        self._num_made[role] += 1
        instance_id = f"{role}-{index}"
        if role == "prefill":
            instance = PrefillInstance(instance_id, f"p{index}")
        else:
            instance = DecodeInstance(instance_id, f"d{index}", self.config.kv_capacity_tokens())
        capacity = (
            None
            if self.config.cache_tokens_per_node is None
            else self.config.cache_tokens_per_node // TRACE_BLOCK_TOKENS
        )
        self.stores[instance.node] = NodeStore(
            instance.node,
            capacity,
            self.config.ssd_tokens_per_node // TRACE_BLOCK_TOKENS,
            self._on_block_added,
            self._on_block_removed,
        )
        self._instances(role)[instance_id] = instance
        self._register(instance)
        self._telemetry(instance)

    def _drain_one(self, role: str) -> None:
        """The newest instance of `role` that still takes work stops taking it."""
        candidates = [i for i in self._instances(role).values() if not i.is_draining]
        if len(candidates) > 1:
            candidates[-1].is_draining = True

    def _retire(self, instance: PrefillInstance | DecodeInstance) -> None:
        role = "prefill" if isinstance(instance, PrefillInstance) else "decode"
        del self._instances(role)[instance.instance_id]
        self.scheduler.apply_registry_event(
            MirrorEvent(f"/crescent/sim/instances/{role}/{instance.instance_id}", None)
        )

    def _sample_imbalance(self, _: object) -> None:
        """Each period: the conductor's f_im, and each side's true mean SLO load for a timeline
        (the paper's Fig. 6: prefill and decode load swinging against each other)."""
        if self.ratio is not None:
            self.ratio.window.add_loads(*self.scheduler.slo_loads(MODEL))
        factor = self.scheduler.imbalance(MODEL)
        if factor is not None and self.num_open:
            self.imbalance_samples.append(factor)
        now = self.loop.now
        prefill = sum(p.queue_time_s(now) for p in self.prefills.values()) / len(self.prefills)
        decode = sum(
            self.decode_step_s(d.batch.num_running, d.batch.context_tokens)
            for d in self.decodes.values()
        ) / len(self.decodes)
        self.load_timeline.append(
            (now, prefill / self.config.ttft_slo_s, decode / self.config.tbt_slo_s)
        )
        if self.num_open:
            self.loop.after(self.config.telemetry_period_s, self._sample_imbalance)

    def _hot_spot(self, _: object) -> None:
        for order in self.scheduler.hot_spot_orders(MODEL):
            source, target = self.stores[order.source_node], self.stores[order.target_node]
            held = [h for h in order.hashes if source.holds(h)]
            if held:
                self.num_replication_orders += 1
                done = self.network.transfer(
                    source.node, target.node, len(held) * self.block_bytes, self.loop.now
                )
                self.loop.at(done, target.write, held)
        if self.num_open:
            self.loop.after(self.config.hot_spot_period_s, self._hot_spot)

    # -- a request's path ---------------------------------------------------------------------

    def submit(self, request: SimRequest) -> None:
        self.num_open += 1
        self.loop.at(request.arrival_s, self._arrive, request)

    def _arrive(self, request: SimRequest) -> None:
        """conductor/flow.py's place(): ask, record, reserve; a refused reservation is forgotten
        and the policy asked again without that decode instance."""
        scheduled = ScheduleRequest(
            request.request_id,
            request.blocks,
            request.num_prompt,
            TRACE_BLOCK_TOKENS,
            request.num_output,
        )
        is_baseline = self.config.admission == "baseline"
        refused: list[str] = []
        while True:
            outcome = self.scheduler.schedule(scheduled, MODEL, refused)
            if isinstance(outcome, Rejection):
                self._finish(request, Status.REJECTED, outcome.reason.value)
                return
            self.scheduler.record(scheduled, outcome)
            decode = self.decodes[outcome.decode.instance_id]
            if is_baseline:
                # The baseline's decode hears of the request now but takes its room only when
                # the request reaches it: its reports acknowledge the assignment without it.
                self._take_in("decode", decode, request.request_id)
                break
            if decode.can_reserve(scheduled.num_kv_tokens):
                decode.reserve(request.request_id, scheduled.num_kv_tokens, request.num_prompt)
                self._take_in("decode", decode, request.request_id)
                break
            self.scheduler.forget(scheduled, outcome)
            refused.append(decode.instance_id)
        request.decision = outcome
        request.decode_id = outcome.decode.instance_id
        request.predicted_prefill_s = outcome.prefill.prefill_s
        if outcome.prefill_on_decode:
            self._compute_on_decode(decode, request)
            return
        prefill = self.prefills[outcome.prefill.instance_id]
        if (
            is_baseline
            and prefill.queue_time_s(self.loop.now) + outcome.prefill.prefill_s
            > self.config.ttft_slo_s
        ):
            # The baseline's prefill-side load check: the instance refuses a job it cannot finish
            # in time.
            self.scheduler.on_finished(request.request_id, False)
            self._finish(request, Status.REJECTED, "prefill-load")
            return
        self._take_job(prefill, request)
        prefill.queue.append(request)
        prefill.num_queued_tokens += request.num_prompt
        self._take_in("prefill", prefill, request.request_id)
        if prefill.is_idle:
            self._start_prefill(prefill)

    def _compute_on_decode(self, decode: DecodeInstance, request: SimRequest) -> None:
        """Conditional disaggregation: the decode instance computes the prompt in its next step,
        with what its node's store holds of it, and the running batch's token waits for it."""
        store = self.stores[decode.node]
        request.reuse_blocks(store.prefix_run(request.blocks))
        store.read(request.blocks[: request.num_cached_blocks])
        request.compute_s = self.costs.prefill_s(request.num_prompt, request.cached_tokens)
        self.scheduler.on_decode_started(request.request_id)  # the decode acknowledged it
        decode.to_compute.append(request)
        if not decode.is_stepping:
            self._next_step(decode, self.loop.now)

    def _take_job(self, prefill: PrefillInstance, request: SimRequest) -> None:
        """What the prefill worker does when a job comes, before it queues: the planned pull,
        then the prefix its node's store holds, which is what the job will load (blocks stored
        while it waits are not counted, as in prefill/worker.py)."""
        now = self.loop.now
        store = self.stores[prefill.node]
        choice = request.decision.prefill
        request.pull_done_s = now
        if choice.source_node is not None and self.config.cache_scope == "global":
            source = self.stores[choice.source_node]
            pulled = []
            for block in choice.pull_hashes:  # what the source still holds, from the front
                if not source.holds(block):
                    break
                pulled.append(block)
            if pulled:
                source.read(pulled)
                request.pull_done_s = self.network.transfer(
                    source.node, store.node, len(pulled) * self.block_bytes, now
                )
                store.write(pulled)
        request.reuse_blocks(store.prefix_run(request.blocks))

    def _start_prefill(self, prefill: PrefillInstance) -> None:
        request = prefill.queue.popleft()
        store = self.stores[prefill.node]
        # Blocks evicted while the job waited are computed after all.
        run = store.prefix_run(request.blocks[: request.num_cached_blocks])
        if run < request.num_cached_blocks:
            request.reuse_blocks(run)
        num_from_ssd = store.read(request.blocks[:run])
        request.compute_s = self.costs.prefill_s(request.num_prompt, request.cached_tokens)
        ssd_s = num_from_ssd * self.block_bytes / (self.config.ssd_gbps * 1e9)
        prefill.running = request
        prefill.running_ends_s = max(self.loop.now, request.pull_done_s) + ssd_s + request.compute_s
        self.loop.at(prefill.running_ends_s, self._prefill_done, prefill)

    def _prefill_done(self, prefill: PrefillInstance) -> None:
        request = prefill.running
        prefill.running = None
        prefill.num_queued_tokens -= request.num_prompt
        now = self.loop.now
        request.first_token_s = now
        if self.ratio is not None:
            self.ratio.window.add_ttft(now - request.arrival_s)
        self.stores[prefill.node].write(request.blocks)
        decode = self.decodes[request.decode_id]
        if request.num_output <= 1:
            self._finish_on_first_token(decode, request)
        elif self.config.admission == "baseline" and not self._decode_admits(decode, request):
            self.scheduler.on_finished(request.request_id, False)
            self._finish(request, Status.REJECTED_AFTER_PREFILL, "decode-load")
        else:
            if self.config.admission == "baseline":
                decode.reserve(
                    request.request_id, request.num_prompt + request.num_output, request.num_prompt
                )
            self.stores[decode.node].write(request.blocks)
            self.scheduler.on_decode_started(request.request_id)
            self.loop.after(self._decode_load_s(request), self._join_decode, request)
        if prefill.queue:
            self._start_prefill(prefill)

    def _take_in(
        self, role: str, instance: PrefillInstance | DecodeInstance, request_id: str
    ) -> None:
        """The instance holds the request's work now: its telemetry acknowledges the conductor's
        assignment (what the real workers report in InstanceLoad.received)."""
        number = self.view.assignment_number(role, instance.instance_id, request_id)
        take_in(instance.received, self.view.conductor_id, number)

    def _decode_load_s(self, request: SimRequest) -> float:
        """Host-to-device load of the prompt's KV on the decode node, pipelined with the
        prefill layer by layer (each layer's KV lands in the decode node's DRAM as prefill
        finishes it): what is left after the prefill ends is the last layer's share."""
        load_s = (
            request.num_prompt
            * self.config.model_dims.kv_bytes_per_token
            / (self.config.h2d_gbps * 1e9)
        )
        return load_s / self.config.model_dims.num_layers

    def _decode_admits(self, decode: DecodeInstance, request: SimRequest) -> bool:
        """The baseline's decode-side load check, made when the request reaches decode."""
        if not decode.can_reserve(request.num_prompt + request.num_output):
            return False
        batch = decode.batch
        tbt = self.costs.decode_step_s(
            batch.num_running + len(decode.joining) + 1, batch.context_tokens + request.num_prompt
        )
        return tbt <= self.config.tbt_slo_s

    def _join_decode(self, request: SimRequest) -> None:
        decode = self.decodes[request.decode_id]
        decode.joining.append(request)
        if not decode.is_stepping:
            self._next_step(decode, self.loop.now)

    def _step_done(self, decode: DecodeInstance) -> None:
        now = self.loop.now
        if decode.batch.num_running:
            for request in decode.batch.emit(now):
                decode.kv_used_tokens -= decode.reserved.pop(request.request_id, 0)
                self.scheduler.on_finished(request.request_id, True)
                self._finish(request, Status.OK)
        for request in decode.computing:
            self._computed_on_decode(decode, request)
        decode.computing = []
        self._next_step(decode, now)

    def _computed_on_decode(self, decode: DecodeInstance, request: SimRequest) -> None:
        """A prompt the decode instance computed: its first token is out, its blocks saved to
        the node's store, and it decodes from the next step on."""
        now = self.loop.now
        request.first_token_s = now
        if self.ratio is not None:
            self.ratio.window.add_ttft(now - request.arrival_s)
        self.scheduler.on_computed_on_decode(
            request.request_id, request.num_prompt, request.cached_tokens
        )
        self.stores[decode.node].write(request.blocks)
        if request.num_output <= 1:
            self._finish_on_first_token(decode, request)
        else:
            decode.joining.append(request)

    def _finish_on_first_token(self, decode: DecodeInstance, request: SimRequest) -> None:
        """An answer of one token: its decode room goes back and, as in flow.py, the request
        ends there without a decode time to learn from."""
        decode.release(request.request_id)
        self.scheduler.on_finished(request.request_id, False)
        self._finish(request, Status.OK)

    def _next_step(self, decode: DecodeInstance, now: float) -> None:
        """Waiting requests join at the step boundary, and the prompts the instance computes
        itself go into the step, which they make longer; with neither, stepping stops."""
        batch = decode.batch
        if decode.joining:
            for request in decode.joining:
                batch.add(request)
                decode.join(request.request_id)
            decode.joining.clear()
        decode.computing, decode.to_compute = decode.to_compute, []
        decode.is_stepping = batch.num_running > 0 or bool(decode.computing)
        if decode.is_stepping:
            step_s = sum(request.compute_s for request in decode.computing)
            if batch.num_running:
                step_s += self.decode_step_s(batch.num_running, batch.context_tokens)
            self.loop.at(now + step_s, self._step_done, decode)

    def _finish(self, request: SimRequest, status: Status, reason: str = "") -> None:
        request.status = status
        request.reject_reason = reason
        self.num_open -= 1
        if self.ratio is not None:
            if reason:
                self.ratio.record_rejection(reason)
            elif status is Status.OK and request.num_output > 1:
                self.ratio.window.add_tbt(request.tbt_s)
