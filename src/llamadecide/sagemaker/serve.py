"""The container's `serve` entrypoint: SageMaker runs `docker run IMAGE serve`; this listens on
0.0.0.0:8080, takes the model from /opt/ml/model (or SM_LLAMA_CPP_MODEL), calibration profiles
from /opt/ml/model/profiles when the archive has them, and SM_LLAMA_CPP_* settings."""

from __future__ import annotations

import logging
import os
import sys

SAGEMAKER_PORT = 8080


def sagemaker_settings():
    from llamadecide.engine.model_files import model_dir
    from llamadecide.settings import Settings

    overrides: dict = {}
    if "LLAMADECIDE_OPEN_INVOCATIONS" not in os.environ:
        overrides["open_invocations"] = True  # SageMaker authenticates at its edge and forwards no key
    if "LLAMADECIDE_HOST" not in os.environ and "SM_LLAMA_CPP_HOST" not in os.environ:
        overrides["host"] = "0.0.0.0"
    if "LLAMADECIDE_PORT" not in os.environ and "SM_LLAMA_CPP_PORT" not in os.environ:
        overrides["port"] = SAGEMAKER_PORT
    profiles = model_dir() / "profiles"
    if "LLAMADECIDE_PROFILES_DIR" not in os.environ and profiles.is_dir():
        overrides["profiles_dir"] = profiles
    return Settings(**overrides)


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
