"""`python -m crescent.conductor` / `crescent-conductor`."""

from crescent.common.service import service_main
from crescent.conductor.app import Conductor
from crescent.conductor.settings import ConductorSettings


def main() -> None:
    service_main("conductor", ConductorSettings, Conductor)


if __name__ == "__main__":
    main()
