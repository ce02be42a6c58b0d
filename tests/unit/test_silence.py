"""A silent decode instance is asked again sooner at first, then less often: the waits double
from FIRST_ASK_AGAIN_S, and the first silence's time is kept (it bounds the whole wait)."""

from crescent.conductor.flow_state import FIRST_ASK_AGAIN_S, Silence


def test_the_wait_before_asking_again_doubles_and_the_first_silence_is_kept():
    silence = Silence.first(100.0)
    assert (silence.since, silence.ask_at) == (100.0, 100.0 + FIRST_ASK_AGAIN_S)
    waits = []
    now = silence.ask_at
    for _ in range(4):
        silence = silence.again(now)
        waits.append(round(silence.ask_at - now, 9))
        now = silence.ask_at
    assert waits == [FIRST_ASK_AGAIN_S * 2**k for k in range(1, 5)]
    assert silence.since == 100.0
