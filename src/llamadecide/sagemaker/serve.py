"""The container's `serve` entrypoint: SageMaker runs `docker run IMAGE serve`; this listens on
0.0.0.0:8080, takes the model from /opt/ml/model (or SM_LLAMA_CPP_MODEL), calibration profiles
from /opt/ml/model/profiles when the archive has them, and SM_LLAMA_CPP_* settings."""

from __future__ import annotations

import logging
import sys


def sagemaker_settings():
    from llamadecide.settings import Settings

    return Settings.for_container()


def main(argv: list[str] | None = None) -> int:
    from llamadecide.server.runner import run_server

    args = sys.argv[1:] if argv is None else argv
    if args and args[0] not in ("serve",):
        print(f"usage: serve (SageMaker starts the container with `serve`); got {' '.join(args)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = sagemaker_settings()
    # keep-alive above SageMaker's 60 s, so the proxy closes first
    return run_server(settings, timeout_keep_alive=75)


if __name__ == "__main__":
    raise SystemExit(main())
