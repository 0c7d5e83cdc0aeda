"""A help desk: a triage agent hands the customer off to a billing agent, which looks the invoice
up with a function tool: an OpenAI Agents SDK app (`pip install openai-agents`) written the way
the SDK's documentation writes them, with no kvscope in it.

    kvscope profile -- python examples/openai_agents.py            # the embedded engine
    kvscope profile -- python examples/openai_agents.py --responses   # the SDK's default model
    OPENAI_BASE_URL=http://host:8000/v1 KVSCOPE_MODEL=... python examples/openai_agents.py

    Runner.run (one per question) --> triage --hand-off--> billing --> lookup_invoice (tool)

Each agent is an agent to kvscope (triage, billing), each run a workflow, the run's group_id
(`customer-<n>`) its thread. The agents speak chat completions (`OpenAIChatCompletionsModel`);
`--responses` gives them the SDK's default model instead (a model name: OpenAIResponsesModel,
POST /v1/responses), which vLLM serves too and kvscope profiles the same way. A model as small as
the embedded engine's seldom calls a tool on its own, so each agent names the tool it calls
(`tool_choice`: the engine decodes the call to the tool's schema) and billing's tool result is
its answer (`tool_use_behavior="stop_on_first_tool"`). vLLM 0.32.0's /v1/responses does not
enforce a named tool_choice (it parses the tool call the model writes): with `--responses` the
hand-off is the model's own choice (on the embedded engine both runs of a test handed off).
The SDK's tracing stays on but is exported nowhere (`--no-tracing`: disabled, as apps on other
providers often run it; kvscope then has no group_id to give as thread).
"""

import argparse
import asyncio
import os

QUESTIONS = ("Why was I charged twice?", "Is my March invoice paid?", "Can I get a refund?")


def build(responses: bool) -> object:
    """The triage agent (the run's starting agent), with billing behind a hand-off; `responses`:
    the SDK's default model (the Responses API), else chat completions."""
    from agents import Agent, Model, ModelSettings, OpenAIChatCompletionsModel, function_tool
    from openai import AsyncOpenAI

    name = os.environ.get("KVSCOPE_MODEL", "default")
    model: str | Model = (
        name if responses else OpenAIChatCompletionsModel(model=name, openai_client=AsyncOpenAI())
    )

    @function_tool
    def lookup_invoice() -> str:
        """The customer's latest invoice."""
        return "invoice 2031, 42.00 EUR, paid on March 3"

    billing = Agent(
        name="billing",
        instructions="You answer billing questions from the customer's invoice.",
        model=model,
        model_settings=ModelSettings(tool_choice="lookup_invoice", max_tokens=96),
        tools=[lookup_invoice],
        tool_use_behavior="stop_on_first_tool",
    )
    return Agent(
        name="triage",
        instructions="You route the customer to the right desk.",
        model=model,
        model_settings=ModelSettings(tool_choice="transfer_to_billing", max_tokens=96),
        handoffs=[billing],
    )


async def main(questions: int, tracing: bool, responses: bool) -> None:
    from agents import RunConfig, Runner, set_trace_processors, set_tracing_disabled

    if tracing:
        set_trace_processors([])  # traced, exported nowhere (no OpenAI account here)
    else:
        set_tracing_disabled(True)
    triage = build(responses)
    for n, question in enumerate(QUESTIONS[:questions], 1):
        config = RunConfig(workflow_name="help desk", group_id=f"customer-{n}")
        result = await Runner.run(triage, question, run_config=config)
        print(f"[customer-{n}] {result.last_agent.name}: {result.final_output}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=2, help="runs, one per question (1-3)")
    parser.add_argument("--no-tracing", action="store_true", help="set_tracing_disabled(True)")
    parser.add_argument(
        "--responses", action="store_true", help="the SDK's default model (Responses API)"
    )
    args = parser.parse_args()
    questions = max(1, min(args.questions, len(QUESTIONS)))
    asyncio.run(main(questions, not args.no_tracing, args.responses))
