"""A cancel handled before its start (they arrive on different subjects) wins: nothing runs."""

import pytest

from crescent.common.messages import DecodeCancel, DecodeStart, Reservation
from crescent.decode.worker import DecodeSettings, DecodeWorker, StartRejected


async def test_start_after_cancel_is_refused_and_holds_no_room():
    worker = DecodeWorker(DecodeSettings())
    await worker.reserve(Reservation(request_id="r", num_prompt_tokens=10, max_tokens=10))
    await worker.cancel(DecodeCancel(request_id="r"))
    with pytest.raises(StartRejected, match="cancelled"):
        await worker.start_request(
            DecodeStart(request_id="r", token_ids=[1] * 10, first_token=2, max_tokens=10)
        )
    assert worker.ledger.used_tokens == 0 and worker.engine.num_running == 0
