"""What a service's telemetry says about taking work, by the service's status."""

import pytest

from crescent.common.messages import InstanceLoad
from crescent.common.service import ServiceStatus, as_published

LOAD = InstanceLoad(role="store", instance_id="store-a", node="n", sent_at=0.0, period_s=0.2)


@pytest.mark.parametrize("status", [ServiceStatus.DRAINING, ServiceStatus.STOPPED])
def test_a_draining_or_stopped_service_says_it_takes_no_work(status):
    # STOPPED: the telemetry task may report once more while the service closes, lease revoked
    report = as_published(LOAD, status)
    assert not report.is_accepting and report.not_accepting_reason == "draining"


def test_a_serving_service_reports_its_load_as_it_is():
    full = InstanceLoad(
        role="decode",
        instance_id="d",
        node="n",
        sent_at=0.0,
        period_s=0.2,
        is_accepting=False,
        not_accepting_reason="full",
    )
    assert as_published(LOAD, ServiceStatus.SERVING) == LOAD
    assert as_published(full, ServiceStatus.SERVING) == full
