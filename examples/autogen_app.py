"""A writers' room: a planner, a writer and a critic take turns on a short task, an AutoGen
AgentChat team (`pip install "autogen-agentchat==0.7.5" "autogen-ext[openai]==0.7.5"`) written
the way AutoGen's documentation writes them, with no kvscope in it.

    kvscope profile -- /path/to/venv/bin/python examples/autogen_app.py             # round robin
    kvscope profile -- /path/to/venv/bin/python examples/autogen_app.py --selector  # model picks
    OPENAI_BASE_URL=http://host:8000/v1 KVSCOPE_MODEL=... python examples/autogen_app.py

    team.run (one per task) --> planner --> writer --> critic --> planner ... (MaxMessages)

Each AssistantAgent is an agent to kvscope (planner, writer, critic), each `team.run` a workflow.
With `--selector` the team is a SelectorGroupChat: before each turn the team's own manager asks
the model who speaks next, a call kvscope names as AutoGen names the manager
(`SelectorGroupChatManager`); a model too small to answer with a name leaves the choice to
AutoGen's fallback (one attempt, then the previous speaker or the first participant). The model
client is autogen-ext's OpenAIChatCompletionClient, which reads the engine from the OpenAI SDK's
own variables (OPENAI_BASE_URL, OPENAI_API_KEY); `model_info` describes the non-OpenAI model.
"""

import argparse
import asyncio
import os

TASKS = ("A haiku about tides.", "A slogan for a bakery.", "A riddle about rainbows.")
ROLES = {
    "planner": "You plan the piece in one short line.",
    "writer": "You write the piece in one or two short lines.",
    "critic": "You suggest one short improvement.",
}


def model_client() -> object:
    """A chat completions client for the engine's model (no tools, no JSON: a small model)."""
    from autogen_core.models import ModelInfo
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    info = ModelInfo(vision=False, function_calling=False, json_output=False, family="unknown",
                     structured_output=False)  # fmt: skip
    return OpenAIChatCompletionClient(
        model=os.environ.get("KVSCOPE_MODEL", "SmolLM2-135M-Instruct"),
        api_key=os.environ.get("OPENAI_API_KEY", "none"),  # a local engine takes any key
        model_info=info,
        max_tokens=32,
    )


def build(selector: bool, messages: int) -> object:
    """The team: the three agents in turn, or chosen by the model with `selector`."""
    from autogen_agentchat.agents import AssistantAgent
    from autogen_agentchat.conditions import MaxMessageTermination
    from autogen_agentchat.teams import RoundRobinGroupChat, SelectorGroupChat

    client = model_client()
    agents = [
        AssistantAgent(name, model_client=client, system_message=role, description=role)
        for name, role in ROLES.items()
    ]
    done = MaxMessageTermination(messages)
    if selector:
        return SelectorGroupChat(agents, model_client=client, name="writers_room",
                                 termination_condition=done, max_selector_attempts=1)  # fmt: skip
    return RoundRobinGroupChat(agents, name="writers_room", termination_condition=done)


async def main(tasks: int, selector: bool, messages: int) -> None:
    team = build(selector, messages)
    for n, task in enumerate(TASKS[:tasks], 1):
        await team.reset()  # type: ignore[attr-defined]  # each task a conversation of its own
        result = await team.run(task=task)  # type: ignore[attr-defined]
        last = result.messages[-1]
        print(f"[task-{n}] {last.source}: {last.to_text()[:80]!r} ({result.stop_reason})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=2, help="team runs, one per task (1-3)")
    parser.add_argument("--messages", type=int, default=4, help="messages a run stops at (>= 2)")
    parser.add_argument(
        "--selector", action="store_true", help="a SelectorGroupChat: the model picks who speaks"
    )
    args = parser.parse_args()
    tasks = max(1, min(args.tasks, len(TASKS)))
    asyncio.run(main(tasks, args.selector, max(2, args.messages)))
