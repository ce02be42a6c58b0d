from crescent.common.tokenizer import ByteTokenizer
from crescent.conductor.text import TextAssembler


def feed(stop, text, step=1):
    tokenizer = ByteTokenizer()
    assembler = TextAssembler(tokenizer.stream_decoder(), stop)
    ids = tokenizer.encode(text)
    out = ""
    for i in range(0, len(ids), step):
        out += assembler.push(ids[i : i + step])
        if assembler.is_stopped:
            break
    return out + assembler.finish(), assembler.is_stopped


def test_no_stop_passes_everything():
    assert feed([], "hello world") == ("hello world", False)


def test_stop_string_across_tokens_is_cut_and_never_sent():
    assert feed(["lo w"], "hello world") == ("hel", True)


def test_partial_match_is_released_when_it_does_not_complete():
    assert feed(["low"], "hello world") == ("hello world", False)


def test_multibyte_characters_are_not_split():
    assert feed([], "héllo ✓", step=1) == ("héllo ✓", False)


def test_earliest_stop_wins():
    assert feed(["d", "o"], "hello world") == ("hell", True)
