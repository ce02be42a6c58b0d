"""`crescent up` checks --local-prefill as the conductor reads it, before it starts anything."""

import pytest

from crescent.cli.main import build_parser


def test_crescent_up_refuses_a_bad_local_prefill_before_starting_anything(capsys):
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["up", "--local-prefill", "sometimes"])
    assert stopped.value.code == 2
    assert "off, auto or a number of tokens, got 'sometimes'" in capsys.readouterr().err
    assert build_parser().parse_args(["up", "--local-prefill", "512"]).local_prefill == "512"
