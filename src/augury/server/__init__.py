"""OpenAI-compatible HTTP server: `create_app` over a batching `augury.scheduler.Scheduler`."""

from augury.server.app import create_app
from augury.server.state import ServerConfig

__all__ = ["ServerConfig", "create_app"]
