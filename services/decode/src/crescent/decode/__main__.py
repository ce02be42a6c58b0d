"""`python -m crescent.decode` / `crescent-decode`."""

from crescent.common.service import service_main
from crescent.decode.worker import DecodeSettings, DecodeWorker


def main() -> None:
    service_main("decode", DecodeSettings, DecodeWorker)


if __name__ == "__main__":
    main()
