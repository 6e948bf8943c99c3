"""Two concurrent runs of one OpenAI Agents SDK agent with a function tool, as two users of one
app would start them: the same task, each with its own `prompt_cache_key` and
`safety_identifier` (per-user fields a gateway must not key on).

The agent's model settings force a tool call (`tool_choice="required"`); the SDK resets that
once the tool ran (`reset_tool_choice`), so each run takes two model steps: the call, then the
answer. Usage: agents_sdk.py <corral base URL ending in /v1>. Prints one JSON line.
"""

import asyncio
import json
import sys

from openai import AsyncOpenAI
from agents import (
    Agent,
    ModelSettings,
    Runner,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)

# Traces would be exported to OpenAI's servers; the tests reach nothing but loopback.
set_tracing_disabled(True)

calls = []


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    calls.append(city)
    return f"It is sunny in {city}."


async def run(cache_key, user):
    agent = Agent(
        name="weather",
        instructions="Answer questions about the weather. Look it up first.",
        tools=[get_weather],
        model_settings=ModelSettings(
            tool_choice="required",
            extra_args={"prompt_cache_key": cache_key, "safety_identifier": user},
        ),
    )
    result = await Runner.run(agent, "What is the weather in Paris?")
    return {
        "final": result.final_output,
        "items": [item.type for item in result.new_items],
        "steps": len(result.raw_responses),
    }


async def main():
    # The gateway does the retrying; an SDK retry would blur the call count.
    client = AsyncOpenAI(base_url=sys.argv[1], api_key="sk-agents-app", max_retries=0)
    set_default_openai_client(client, use_for_tracing=False)
    runs = await asyncio.gather(run("session-a", "user-a"), run("session-b", "user-b"))
    print(json.dumps({"runs": runs, "tool_calls": len(calls)}))


asyncio.run(main())
