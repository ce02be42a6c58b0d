"""`python -m crescent.store` / `crescent-store`."""

from crescent.common.config import CommonSettings
from crescent.common.service import service_main
from crescent.store.daemon import StoreDaemon


def main() -> None:
    service_main("store", CommonSettings, StoreDaemon)


if __name__ == "__main__":
    main()
