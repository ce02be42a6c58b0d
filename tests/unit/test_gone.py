"""Gone: the instances a request left because they failed it, each in the incarnation that
failed; and whether that same process is back (a rejoin) rather than a restarted one."""

from __future__ import annotations

from crescent.common.codec import encode
from crescent.common.etcd import MirrorEvent
from crescent.common.messages import InstanceInfo
from crescent.conductor.cluster_view import ClusterView
from crescent.conductor.flow_state import Gone

KEY = "/crescent/c/instances/decode/d0"


def register(view: ClusterView, started_at: float) -> None:
    info = InstanceInfo(role="decode", instance_id="d0", node="n", model="m", started_at=started_at)
    view.apply_registry(MirrorEvent(KEY, encode(info)))


def test_the_same_process_registered_again_is_back_and_stays_left_out():
    view = ClusterView(clock=lambda: 100.0)
    register(view, started_at=1.0)
    gone = Gone(view, "decode")
    gone.add("d0", view.started_at("decode", "d0"))
    view.apply_registry(MirrorEvent(KEY, None))  # its lease ended, unheard: removed
    assert not gone.is_back("d0") and gone.ids() == {"d0"}
    register(view, started_at=1.0)
    assert gone.is_back("d0") and gone.ids() == {"d0"}


def test_a_restarted_process_under_the_same_id_is_not_back_but_usable():
    view = ClusterView(clock=lambda: 100.0)
    register(view, started_at=1.0)
    gone = Gone(view, "decode")
    gone.add("d0", view.started_at("decode", "d0"))
    view.apply_registry(MirrorEvent(KEY, None))
    register(view, started_at=2.0)
    assert not gone.is_back("d0") and gone.ids() == set()
    assert not gone.is_back("d1")
