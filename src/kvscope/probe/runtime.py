"""kvscope's AgentRuntime: every agent call goes through the probe and gets its MLflow spans."""

import uuid
from contextlib import AbstractContextManager
from typing import Any

from kvscope.probe.client import Probe
from kvscope.probe.tracing import Tracer
from kvscope.workload.runtime import CallIds, LlmCall, LlmReply, ToolSpan


class ProfiledRuntime:
    def __init__(self, probe: Probe, tracer: Tracer, workflow_type: str) -> None:
        self.probe = probe
        self.tracer = tracer
        self.workflow_type = workflow_type

    async def llm(self, call: LlmCall) -> LlmReply:
        request_uuid = str(uuid.uuid4())
        model = self.probe.run.model_name
        with self.tracer.llm(call.ids, request_uuid, call.messages, model) as span:
            record, content = await self.probe.call(call, request_uuid)
            span.finish(record, content)
        return LlmReply(request_uuid, content, record.status, record.error_type)

    def workflow_span(
        self, benchmark_run_id: str, thread_id: str, workflow_run_id: str
    ) -> AbstractContextManager[None]:
        return self.tracer.workflow(
            benchmark_run_id, thread_id, workflow_run_id, self.workflow_type
        )

    def agent_span(self, ids: CallIds) -> AbstractContextManager[None]:
        return self.tracer.agent(ids)

    def tool_span(self, name: str, inputs: dict[str, Any]) -> AbstractContextManager[ToolSpan]:
        return self.tracer.tool(name, inputs)
