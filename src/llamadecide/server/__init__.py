"""The HTTP edge: OpenAI-compatible chat, decisions in two wire formats, SageMaker routes."""

from llamadecide.server.app import create_app

__all__ = ["create_app"]
