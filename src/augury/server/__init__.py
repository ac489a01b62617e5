"""OpenAI-compatible HTTP server: `create_app` over a batching `augury.scheduler.Scheduler`."""

from augury.server.app import ServerConfig, create_app

__all__ = ["ServerConfig", "create_app"]
