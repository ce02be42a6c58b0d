"""The 1P1D request's messages between three bare processes: what the control path's design
costs before any of Crescent's own work (`crescent bench control-plane`, case floor-1P1D).

The same libraries as the services (aiohttp, nats-py, msgspec, uvloop) and the same NATS
messages as a 1P1D request: the conductor sends the decode its reservation and the prefill its
job at once; the prefill sends the decode its start, whose answer goes to the conductor, and
answers the job; the decode answers the reservation and the start, then sends the tokens. Each
process does nothing else: no parsing into a request, tokenizing, scheduling, learning,
tracing or metrics. Its run against 1P1D's says how much of a request's time and CPU is
Crescent's per-request work and how much the hops themselves.

`python -m crescent.bench.messaging_floor conductor|prefill|decode --nats-url URL [--port P]`
"""

from __future__ import annotations

import argparse
import asyncio
import itertools

import msgspec
import nats
import uvloop
from aiohttp import web
from nats.aio.msg import Msg

READY_TIMEOUT_S = 20.0
REPLY_TIMEOUT_S = 10.0


class Job(msgspec.Struct):
    request_id: str
    model: str
    prompt: str
    max_tokens: int


class Start(msgspec.Struct):
    request_id: str
    first_token: int
    max_tokens: int


class Reply(msgspec.Struct):
    request_id: str
    token_ids: list[int] = []
    is_final: bool = False


_encode = msgspec.msgpack.encode
_job = msgspec.msgpack.Decoder(Job)
_start = msgspec.msgpack.Decoder(Start)
_reply = msgspec.msgpack.Decoder(Reply)


async def _ready(msg: Msg) -> None:
    await msg.respond(b"")


async def prefill(url: str) -> None:
    client = await nats.connect(url)

    async def on_job(msg: Msg) -> None:
        job = _job.decode(msg.data)
        start = Start(job.request_id, 1, job.max_tokens)
        await client.publish(
            "floor.decode.start", _encode(start), reply=f"floor.conductor.{job.request_id}"
        )
        await msg.respond(_encode(Reply(job.request_id, [1])))

    await client.subscribe("floor.prefill.job", cb=on_job)
    await client.subscribe("floor.prefill.ready", cb=_ready)
    await asyncio.Event().wait()


async def decode(url: str) -> None:
    client = await nats.connect(url)

    async def on_reserve(msg: Msg) -> None:
        await msg.respond(_encode(Reply(_job.decode(msg.data).request_id)))

    async def on_start(msg: Msg) -> None:
        start = _start.decode(msg.data)
        await msg.respond(_encode(Reply(start.request_id)))
        tokens = list(range(2, start.max_tokens + 1))
        await client.publish(msg.reply, _encode(Reply(start.request_id, tokens, is_final=True)))

    await client.subscribe("floor.decode.reserve", cb=on_reserve)
    await client.subscribe("floor.decode.start", cb=on_start)
    await client.subscribe("floor.decode.ready", cb=_ready)
    await asyncio.Event().wait()


async def conductor(url: str, port: int) -> None:
    client = await nats.connect(url)
    waiting: dict[str, asyncio.Queue[Reply]] = {}

    async def on_reply(msg: Msg) -> None:
        reply = _reply.decode(msg.data)
        queue = waiting.get(reply.request_id)
        if queue is not None:
            queue.put_nowait(reply)

    await client.subscribe("floor.conductor.*", cb=on_reply)
    async with asyncio.timeout(READY_TIMEOUT_S):
        for role in ("prefill", "decode"):
            while True:
                try:
                    await client.request(f"floor.{role}.ready", b"", timeout=0.5)
                    break
                except nats.errors.Error:
                    await asyncio.sleep(0.1)
    ids = itertools.count()

    async def completions(request: web.Request) -> web.Response:
        body = msgspec.json.decode(await request.read())
        job = Job(f"floor-{next(ids)}", body["model"], body["prompt"], body["max_tokens"])
        queue: asyncio.Queue[Reply] = asyncio.Queue()
        waiting[job.request_id] = queue
        data = _encode(job)
        reserved = asyncio.ensure_future(
            client.request("floor.decode.reserve", data, timeout=REPLY_TIMEOUT_S)
        )
        try:
            first = _reply.decode(
                (await client.request("floor.prefill.job", data, timeout=REPLY_TIMEOUT_S)).data
            )
            await reserved
            token_ids = list(first.token_ids)
            async with asyncio.timeout(REPLY_TIMEOUT_S):
                while not (reply := await queue.get()).is_final:
                    pass
            token_ids += reply.token_ids
        finally:
            reserved.cancel()  # a failed job leaves no reservation awaited by nobody
            del waiting[job.request_id]
        answer = {
            "id": job.request_id,
            "object": "text_completion",
            "model": job.model,
            "choices": [{"index": 0, "text": "x" * len(token_ids), "finish_reason": "length"}],
        }
        return web.Response(body=msgspec.json.encode(answer), content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(prog="crescent.bench.messaging_floor")
    parser.add_argument("role", choices=("conductor", "prefill", "decode"))
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--port", type=int, default=0, help="the conductor's HTTP port")
    args = parser.parse_args()
    if args.role == "conductor":
        uvloop.run(conductor(args.nats_url, args.port))
    else:
        uvloop.run(prefill(args.nats_url) if args.role == "prefill" else decode(args.nats_url))


if __name__ == "__main__":
    main()
