"""A prefill result larger than one NATS message: a long prompt's logprobs, each token with
many alternatives, come in parts (crescent.common.payload). The first part is the job's reply;
the prefill instance keeps the whole result a while (prefill/outcomes.py) and answers the
rest on `prefill.<id>.result`, asked from the first logprob this conductor lacks."""

from __future__ import annotations

import msgspec

from crescent.common.bus import Bus
from crescent.common.errors import RemoteError
from crescent.common.messages import PrefillResult, PrefillResultAsk
from crescent.common.naming import Subjects
from crescent.common.tracing import tracer

ASK_WAIT_S = 1.0  # the job is done: its outcome is answered at once


async def whole_result(
    bus: Bus,
    subjects: Subjects,
    prefill_id: str,
    job_id: str,
    first: PrefillResult,
    timeout_s: float,
) -> PrefillResult:
    """`first`, the job's reply, with the prompt logprobs that did not fit it, asked for part
    by part, each within `timeout_s`."""
    logprobs = list(first.prompt_logprobs)
    num_left = first.num_prompt_logprobs_left
    subject = subjects.prefill_result(prefill_id)
    with tracer().start_as_current_span("conductor.prompt_logprobs") as span:
        span.set_attribute("crescent.prefill_instance", prefill_id)
        span.set_attribute("crescent.num_logprobs", len(logprobs) + num_left)
        while num_left:
            ask = PrefillResultAsk(
                request_id=job_id, wait_s=ASK_WAIT_S, prompt_logprobs_from=len(logprobs)
            )
            part = await bus.request(subject, ask, PrefillResult, timeout_s)
            if not part.prompt_logprobs or part.num_prompt_logprobs_left >= num_left:
                raise RemoteError(
                    subject,
                    "incomplete_result",
                    f"no prompt logprobs of job {job_id} from {len(logprobs)}, {num_left} left",
                )
            logprobs.extend(part.prompt_logprobs)
            num_left = part.num_prompt_logprobs_left
    return msgspec.structs.replace(first, prompt_logprobs=logprobs, num_prompt_logprobs_left=0)
