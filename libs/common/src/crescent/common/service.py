"""The lifecycle every Crescent service shares (STYLE 7: idempotent start / drain / close).

    settings → connect NATS and etcd (bounded) → HTTP /health and /metrics → service.start()
    → register in etcd under the lease → telemetry every period → … → SIGTERM →
    telemetry says "draining" → service.finish_inflight() → deregister (revoke the lease)
    → service.drain() → drain NATS → close

The instance stays registered while it finishes its accepted work: a conductor moves a
request off an instance that leaves the registry, so deregistering first would restart every
request in flight elsewhere instead of letting it finish. Telemetry goes on saying "draining",
so no new work comes.

A service is an object with `role`, `start(runtime)`, `instance_info()`, `load()`, `health()`,
`finish_inflight()` and `drain()`; `run_service` does the rest, so the four services differ
only in what they do.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import secrets
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Protocol

import msgspec
import nats.errors
import prometheus_client
import uvloop
from aiohttp import web

from crescent.common import tracing
from crescent.common.bus import Bus
from crescent.common.codec import encode
from crescent.common.config import CommonSettings
from crescent.common.errors import ConfigError, ConnectionLostError, FatalError
from crescent.common.etcd import LeasedKeys, connect_etcd
from crescent.common.heartbeat import LeaseHeartbeat
from crescent.common.http_server import JsonErrorRunner
from crescent.common.load_metrics import record_load
from crescent.common.logs import setup_logging
from crescent.common.messages import InstanceInfo, InstanceLoad
from crescent.common.naming import Keys, Subjects, check_token
from crescent.common.ports import listening_socket
from crescent.common.stop_deadline import StopDeadline
from crescent.common.supervisor import TaskSupervisor

log = logging.getLogger(__name__)


class ServiceStatus(enum.Enum):
    CREATED = "created"
    STARTING = "starting"
    SERVING = "serving"
    DRAINING = "draining"
    STOPPED = "stopped"


class Service(Protocol):
    role: str

    async def start(self, runtime: Runtime) -> None: ...

    def instance_info(self) -> InstanceInfo: ...

    def load(self) -> InstanceLoad: ...

    async def finish_inflight(self) -> None:
        """Refuse new work; return once the work already accepted is done (or a deadline passed)."""
        ...

    async def drain(self) -> None:
        """Release what the service holds; runs after it left the registry."""
        ...

    def health(self) -> dict: ...


DRAIN_POLL_S = 0.05  # how often a draining service looks whether its accepted work is done


async def until_drained(num_held: Callable[[], int], timeout_s: float) -> int:
    """Wait while `num_held()` (the accepted work a service still holds) is above 0, for at
    most `timeout_s`; what it holds at the end. For `Service.finish_inflight`."""
    deadline = time.monotonic() + timeout_s
    while num_held() and time.monotonic() < deadline:
        await asyncio.sleep(DRAIN_POLL_S)
    return num_held()


def as_published(load: InstanceLoad, status: ServiceStatus) -> InstanceLoad:
    """The report a service in `status` sends: a draining or stopped one says it takes no new
    work ("draining"), whatever else its load says. Stopped counts too: the telemetry task can
    report once more while the service closes, its lease already revoked, and a report that
    said it accepts would keep a conductor sending it work."""
    if status in (ServiceStatus.DRAINING, ServiceStatus.STOPPED):
        return msgspec.structs.replace(load, is_accepting=False, not_accepting_reason="draining")
    return load


class Runtime:
    """The connections and chores a service gets from the platform."""

    def __init__(self, role: str, settings: CommonSettings) -> None:
        self.role = role
        self.settings = settings
        self.instance_id = check_token(
            "instance_id", settings.instance_id or f"{role}-{secrets.token_hex(3)}"
        )
        check_token("cluster", settings.cluster)
        check_token("node", settings.node)
        self.subjects = Subjects(settings.cluster)
        self.keys = Keys(settings.cluster)
        self.status = ServiceStatus.CREATED
        self.tasks = TaskSupervisor()
        self.http_app = web.Application(client_max_size=settings.max_body_bytes)
        self.http_app.router.add_get("/health", self._health)
        self.http_app.router.add_get("/metrics", self._metrics)
        self.http_port = settings.http_port  # 0 until start_http binds the one it got
        self.bus: Bus | None = None
        self.etcd = None
        self.leased: LeasedKeys | None = None
        self.heartbeat: LeaseHeartbeat | None = None
        self._http_runner: web.AppRunner | None = None
        self.health_details: Callable[[], dict] = dict

    @property
    def advertise_host(self) -> str:
        """The address peers reach this instance at (HTTP, data plane)."""
        host = self.settings.advertise_host or self.settings.host
        return socket.gethostname() if host in ("0.0.0.0", "::") else host

    @property
    def http_url(self) -> str:
        return f"http://{self.advertise_host}:{self.http_port}"

    async def connect(self) -> None:
        self.status = ServiceStatus.STARTING
        self.bus = await Bus.connect(
            self.settings.nats_url,
            self.instance_id,
            self.settings.connect_timeout_s,
            self.settings.nats_reconnect_buffer_bytes,
        )
        self.etcd = await connect_etcd(self.settings.etcd_url, self.settings.connect_timeout_s)
        self.leased = LeasedKeys(self.etcd, self.settings.lease_ttl_s)
        await self.leased.start()
        # Kept alive from now on: a service may take longer to start (a model loading) than the TTL.
        # The loop's keep-alive renews a lost lease; the heartbeat thread keeps it alive while
        # compute holds the loop, so a busy instance is never taken for a dead one.
        self.tasks.spawn("lease-keepalive", self.leased.run())
        self.heartbeat = LeaseHeartbeat(
            self.settings.etcd_url,
            self.leased,
            self.settings.lease_ttl_s,
            self.settings.connect_timeout_s,
        )
        self.heartbeat.start()

    async def start_http(self) -> None:
        # Responses still streaming at a stop get half of its deadline to finish.
        self._http_runner = JsonErrorRunner(
            self.http_app, self.settings.http_idle_timeout_s, self.settings.stop_timeout_s / 2
        )
        await self._http_runner.setup()
        try:
            listener = listening_socket(self.settings.host, self.http_port)
        except OSError as exc:
            raise FatalError(
                f"cannot listen on {self.settings.host}:{self.http_port}: {exc}"
            ) from exc
        self.http_port = listener.getsockname()[1]
        await web.SockSite(self._http_runner, listener).start()

    async def register(self, info: InstanceInfo) -> None:
        await self.leased.put(self.keys.instance(self.role, self.instance_id), encode(info))

    def start_telemetry(self, load: Callable[[], InstanceLoad]) -> None:
        self.tasks.spawn("telemetry", self._publish_telemetry(load))

    async def _publish_telemetry(self, load: Callable[[], InstanceLoad]) -> None:
        while True:
            try:
                await self.publish_load(load)
            except ConnectionLostError:  # a long NATS outage: the next period's report goes out
                pass
            await asyncio.sleep(self.settings.telemetry_period_s)

    async def publish_load(self, load: Callable[[], InstanceLoad]) -> None:
        """One telemetry message, as `as_published` makes it."""
        message = as_published(load(), self.status)
        record_load(message)
        await self.bus.publish(self.subjects.telemetry(self.role, self.instance_id), message)

    async def _health(self, request: web.Request) -> web.Response:
        is_ok = (
            self.status == ServiceStatus.SERVING and self.bus is not None and self.bus.is_connected
        )
        body = {
            "status": self.status.value,
            "role": self.role,
            "instance_id": self.instance_id,
            "nats_connected": bool(self.bus and self.bus.is_connected),
            **self.health_details(),
        }
        return web.json_response(body, status=200 if is_ok else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=prometheus_client.generate_latest(),
            headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST},
        )

    async def deregister(self) -> None:
        if self.leased is not None:
            await self.leased.revoke()

    async def close(self) -> None:
        self.status = ServiceStatus.STOPPED
        if self.heartbeat is not None:
            await asyncio.to_thread(self.heartbeat.stop)
        await self.tasks.close()
        if self.bus is not None:
            await self.bus.drain()
        if self._http_runner is not None:
            await self._http_runner.cleanup()
        if self.etcd is not None:
            await self.etcd.close()


async def serve(service: Service, settings: CommonSettings) -> int:
    """Run `service` until SIGTERM/SIGINT or a supervised task fails; return the exit code.

    A signal during start-up cancels the start. From the signal on, the whole stop runs under
    `settings.stop_timeout_s` (StopDeadline), so a process whose peers vanished with it (a
    supervisor killed by SIGKILL takes NATS and etcd along) still exits."""
    runtime = Runtime(service.role, settings)
    stop = asyncio.Event()
    deadline = StopDeadline(settings.stop_timeout_s)

    def on_signal() -> None:
        stop.set()
        deadline.start()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        starting = asyncio.create_task(_start(service, runtime))
        stop_wait = asyncio.create_task(stop.wait())
        await asyncio.wait([starting, stop_wait], return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            log.info("stopped while starting")
            starting.cancel()
            await asyncio.wait([starting])
            await runtime.deregister()
            await service.drain()
            return 0
        starting.result()
        fail_wait = asyncio.create_task(runtime.tasks.failed.wait())
        await asyncio.wait([stop_wait, fail_wait], return_when=asyncio.FIRST_COMPLETED)
        stop_wait.cancel()
        fail_wait.cancel()
        deadline.start()
        runtime.status = ServiceStatus.DRAINING
        try:  # conductors hear it before the registry entry goes, and send no more work
            await runtime.publish_load(service.load)
        except (
            nats.errors.Error,
            OSError,
        ) as exc:  # NATS may be gone: deregistering says it all the same
            log.warning("draining telemetry not sent", extra={"error": repr(exc)})
        await service.finish_inflight()
        await runtime.deregister()
        await service.drain()
        if runtime.tasks.failure:
            log.error("stopping after failure", extra={"failure": runtime.tasks.failure})
            return 1
        log.info("stopped cleanly")
        return 0
    finally:
        await runtime.close()


async def _start(service: Service, runtime: Runtime) -> None:
    await runtime.connect()
    await service.start(runtime)
    runtime.health_details = service.health
    await runtime.start_http()
    await runtime.register(service.instance_info())
    runtime.start_telemetry(service.load)
    runtime.status = ServiceStatus.SERVING
    log.info("serving", extra={"role": service.role, "http": runtime.http_url})


def run_service(
    role: str, settings: CommonSettings, build: Callable[[CommonSettings], Service]
) -> int:
    """Process entry: logs, tracing, the event loop, and a clear message for fatal errors.
    The loop is uvloop's: every request crosses NATS several times, and a round trip between
    two services took about 20 % less on it than on asyncio's own loop (bench/README.md)."""
    instance_id = settings.instance_id or f"{role}-{secrets.token_hex(3)}"
    settings.instance_id = instance_id
    setup_logging(role, instance_id, settings.log_level, settings.log_format)
    provider = tracing.setup_tracing(role, instance_id)
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(serve(build(settings), settings))
    except (FatalError, ConfigError) as exc:
        log.error("cannot start", extra={"error": str(exc)})
        print(f"crescent-{role}: error: {exc}", file=sys.stderr)
        return 1
    finally:
        started = time.monotonic()
        provider.shutdown()
        log.debug("tracing flushed", extra={"seconds": round(time.monotonic() - started, 3)})


def service_main(
    role: str,
    settings_cls: type[CommonSettings],
    build: Callable[[CommonSettings], Service],
    argv: list[str] | None = None,
) -> None:
    """`python -m crescent.<role>`: parse flags and environment, run, exit with the service's
    code."""
    from crescent.common.config import load_settings

    try:
        settings = load_settings(settings_cls, argv, prog=f"crescent-{role}")
    except ConfigError as exc:
        print(f"crescent-{role}: error: {exc}", file=sys.stderr)
        sys.exit(2)
    sys.exit(run_service(role, settings, build))
