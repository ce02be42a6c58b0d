"""A moved decode goes on from where the last one stopped: what its start message says."""

import msgspec

from crescent.common.messages import SamplingParams
from crescent.conductor.flow_state import DecodeSide
from crescent.conductor.progress import Progress


def test_a_moved_decode_starts_from_the_prompt_plus_all_but_the_last_generated_token():
    progress = Progress(prompt=[1, 2, 3], max_tokens=10, sampling=SamplingParams())
    progress.generated = [7, 8, 9, 4]  # the first token (from prefill) and three streamed ones
    start = progress.decode_start("r-m1")
    assert start.token_ids == [1, 2, 3, 7, 8, 9] and start.first_token == 4
    # The decode engine generates max_tokens - 1 after first_token: 6 more, 10 in all.
    assert start.max_tokens - 1 + len(progress.generated) == 10


def test_each_decode_attempt_has_an_id_of_its_own():
    decode = DecodeSide("cmpl-1")
    assert decode.attempt_id == "cmpl-1"
    decode.attempt += 1
    assert decode.attempt_id == "cmpl-1-m1"


def test_the_start_the_prefill_sends_is_the_one_the_conductor_would_send_after_its_token():
    sampling = SamplingParams(min_tokens=3, prompt_logprobs=2)
    progress = Progress(prompt=[1, 2, 3], max_tokens=10, sampling=sampling)
    template = progress.start_after_prefill("r", "conductor-a")
    assert template is not None and template.from_prefill and template.first_token is None
    progress.generated = [7]  # the prefill's first token
    relayed = progress.decode_start("r", "conductor-a")
    assert template.token_ids == []  # the prefill instance fills in its job's prompt
    filled = msgspec.structs.replace(
        template, token_ids=[1, 2, 3], first_token=7, from_prefill=False
    )
    assert filled == relayed


def test_the_conductor_starts_the_decode_itself_when_the_prefill_cannot():
    replayed = Progress([1, 2], 10, SamplingParams(presence_penalty=0.5))
    assert replayed.start_after_prefill("r", "c") is None  # its decode starts from the prompt
    assert Progress([1, 2], 1, SamplingParams()).start_after_prefill("r", "c") is None
