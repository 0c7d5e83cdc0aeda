"""Any OpenAI-compatible server that is already running: nothing to start, capabilities detected."""

from typing import ClassVar

from kvscope.engines.base import Endpoints, Engine, Launch


class AttachEngine(Engine):
    name: ClassVar[str] = "attach"
    health_path: ClassVar[str] = "/v1/models"  # the one route every OpenAI-compatible server has

    def endpoints(self) -> Endpoints:
        return Endpoints(
            base_url=self.base_url,
            metrics_url=self.config.metrics_url or f"{self.base_url}/metrics",
            kv_events=self.config.kv_events_endpoint,
        )

    def launch(self) -> Launch | None:
        return None
