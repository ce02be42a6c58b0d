"""How many lanes an engine opens to one peer by default: at least two, one a core, at most four."""

import os

import pytest

from crescent.transfer import TransferConfig


@pytest.mark.parametrize(("cores", "lanes"), [(None, 2), (1, 2), (2, 2), (3, 3), (4, 4), (64, 4)])
def test_lanes_follow_the_cores(monkeypatch, cores, lanes):
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert TransferConfig().num_connections == lanes


def test_a_lane_count_given_is_kept(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert TransferConfig(num_connections=8, max_threads=16).num_connections == 8
