"""`python -m crescent.store` / `crescent-store`."""

from crescent.common.service import service_main
from crescent.store.daemon import StoreDaemon
from crescent.store.settings import StoreSettings


def main() -> None:
    service_main("store", StoreSettings, StoreDaemon)


if __name__ == "__main__":
    main()
