"""`python -m crescent.prefill` / `crescent-prefill`."""

from crescent.common.service import service_main
from crescent.engine.settings import EngineSettings
from crescent.prefill.worker import PrefillWorker


def main() -> None:
    service_main("prefill", EngineSettings, PrefillWorker)


if __name__ == "__main__":
    main()
