"""A real decode worker answers well-typed but out-of-range NATS bodies with an error reply and
keeps serving: it stays in the live set and its KV ledger is untouched."""

import asyncio
import math
import time

import pytest
from test_services import service, wait_until, watched  # noqa: F401  (watched is a fixture)

from crescent.common.errors import RemoteError
from crescent.common.messages import DecodeStart, Reservation, ReservationReply
from crescent.common.naming import Subjects


async def test_out_of_range_reservation_and_start_get_error_replies_and_decode_stays_live(
    infra,
    cluster_name,
    tmp_path,
    watched,  # noqa: F811  the fixture imported above
):
    view, loads, bus, _ = watched
    # The good reservation below is never started: the stop need not wait for it.
    process = service(infra, cluster_name, "decode", "decode-b", tmp_path, "--drain-timeout-s", "0")
    subjects = Subjects(cluster_name)
    try:
        await wait_until(lambda: ("decode", "decode-b") in view.instances, 20, "registration")
        poisoned = Reservation(
            request_id="bad", num_prompt_tokens=-5, max_tokens=10, ttl_s=math.nan
        )
        with pytest.raises(RemoteError) as raised:
            await bus.request(
                subjects.decode_reserve("decode-b"), poisoned, ReservationReply, timeout_s=5
            )
        assert raised.value.code == "bad_message" and "num_prompt_tokens" in raised.value.message
        absurd = DecodeStart(request_id="bad", token_ids=[1], first_token=2, max_tokens=1 << 30)
        with pytest.raises(RemoteError, match="max_tokens"):
            await bus.request(
                subjects.decode_start("decode-b"), absurd, ReservationReply, timeout_s=5
            )

        # Several telemetry periods later: still live, nothing held, and a good request is served.
        received = len(loads)
        await asyncio.sleep(1.0)
        assert view.is_live(view.instances[("decode", "decode-b")], time.monotonic())
        latest = [load for load in loads[received:] if load.instance_id == "decode-b"]
        assert latest and latest[-1].kv_used_tokens == 0
        good = Reservation(request_id="good", num_prompt_tokens=5, max_tokens=10)
        reply = await bus.request(
            subjects.decode_reserve("decode-b"), good, ReservationReply, timeout_s=5
        )
        assert reply.accepted
        assert "rejected malformed message" in process.log_tail(50)
    finally:
        process.stop()
