"""Drives corral's Responses API with the official OpenAI Python SDK; run by tests/it/sdk.rs.

Usage: python3 responses_check.py BASE_URL PHASE   (BASE_URL e.g. http://127.0.0.1:PORT/v1)

Each phase is one step of the Rust test, which holds and releases the mock provider around it
(so a herd overlaps by construction, not by luck) and counts the upstream calls:

- herd:    200 concurrent identical `responses.create` calls (AsyncOpenAI), then one repeat.
- stream:  100 concurrent identical `responses.create(stream=True)` calls.
- cut:     20 concurrent streams of a prompt whose upstream stream is cut short.
- again:   the cut prompt once more, streamed.
- chain:   the same input after `previous_response_id` A, B, then A again.

Prints one JSON line of what the SDK saw and exits non-zero if a check failed. Concurrency is
asyncio over one AsyncOpenAI client (the SDK's own connection pool).
"""

import asyncio
import json
import sys

import openai
from phase_runner import run_phase

MODEL = "gpt-4o-mini"


def body(text, **extra):
    return dict(
        model=MODEL,
        temperature=0,
        instructions="Be terse.",
        input=[{"role": "user", "content": text}],
        **extra,
    )


async def create(client, **kwargs):
    """One non-stream call: (x-corral-cache, the Response)."""
    raw = await client.responses.with_raw_response.create(**kwargs)
    return raw.headers.get("x-corral-cache"), raw.parse()


async def stream(client, **kwargs):
    """One streamed call: (x-corral-cache, every event as a dict, the exception if any)."""
    events = []
    error = None
    try:
        raw = await client.responses.with_raw_response.create(stream=True, **kwargs)
        cache = raw.headers.get("x-corral-cache")
        async for event in raw.parse():
            events.append(event.model_dump(mode="json"))
    except Exception as err:  # noqa: BLE001 - reported, not raised
        return None, events, f"{type(err).__name__}: {err}"
    return cache, events, error


def delta_text(events):
    return "".join(e.get("delta", "") for e in events if e["type"] == "response.output_text.delta")


async def herd(client, results, check):
    answers = await asyncio.gather(*[create(client, **body("herd of two hundred")) for _ in range(200)])
    texts = {response.output_text for _, response in answers}
    results["herd_texts"] = len(texts)
    results["herd_cache"] = sorted({cache for cache, _ in answers})
    results["herd_misses"] = sum(1 for cache, _ in answers if cache == "MISS")
    results["herd_ids"] = len({response.id for _, response in answers})
    check(len(texts) == 1, "the herd's answers differ")
    check(all(text for text in texts), "an answer is empty")
    usage = answers[0][1].usage
    results["herd_usage"] = [usage.input_tokens, usage.output_tokens]
    cache, repeat = await create(client, **body("herd of two hundred"))
    results["repeat_cache"] = cache
    results["repeat_same"] = repeat.output_text in texts
    check(cache == "HIT", f"the repeat was {cache}, not HIT")


async def streams(client, results, check):
    outcomes = await asyncio.gather(
        *[stream(client, **body("a hundred streams")) for _ in range(100)]
    )
    errors = [error for _, _, error in outcomes if error]
    sequences = {json.dumps(events, sort_keys=True) for _, events, _ in outcomes}
    events = outcomes[0][1]
    results["stream_errors"] = errors[:3]
    results["stream_sequences"] = len(sequences)
    results["stream_events"] = len(events)
    results["stream_misses"] = sum(1 for cache, _, _ in outcomes if cache == "MISS")
    results["stream_types"] = [events[0]["type"], events[-1]["type"]] if events else []
    check(not errors, f"streams raised: {errors[:3]}")
    check(len(sequences) == 1, "the callers' event sequences differ")
    check(
        [e["sequence_number"] for e in events] == list(range(len(events))),
        "sequence numbers are not 0, 1, 2, ...",
    )
    completed = events[-1] if events else {}
    check(completed.get("type") == "response.completed", "the stream did not complete")
    output = completed.get("response", {}).get("output", [{}])
    text = output[0]["content"][0]["text"] if output and output[0].get("content") else None
    check(delta_text(events) == text, "the deltas do not add up to the completed text")
    # The same prompt without stream: served from what the stream stored.
    cache, response = await create(client, **body("a hundred streams"))
    results["after_stream_cache"] = cache
    check(response.output_text == text, "the stored answer differs from the stream")


async def cut(client, results, check):
    outcomes = await asyncio.gather(
        *[stream(client, **body("a stream that breaks")) for _ in range(20)]
    )
    lasts = []
    for _, events, error in outcomes:
        if error:
            lasts.append(error)
        elif events:
            lasts.append(events[-1]["type"] + ":" + str(events[-1].get("code")))
        else:
            lasts.append("no events")
    results["cut_lasts"] = sorted(set(lasts))
    results["cut_sequences"] = len({json.dumps(events) for _, events, _ in outcomes})
    completed = any(e["type"] == "response.completed" for _, events, _ in outcomes for e in events)
    check(not completed, "a cut stream completed")
    check(
        set(lasts) == {"error:upstream_stream_broken"},
        f"not every caller ended with the error event: {sorted(set(lasts))}",
    )


async def again(client, results, check):
    cache, events, error = await stream(client, **body("a stream that breaks"))
    results["again_cache"] = cache
    results["again_last"] = events[-1]["type"] if events else error
    check(cache == "MISS", f"the call after a cut stream was {cache}, not MISS")
    check(events and events[-1]["type"] == "response.completed", "the new stream did not complete")


async def chain(client, results, check):
    cache_a, a = await create(client, **body("continue", previous_response_id="resp_a"))
    cache_b, b = await create(client, **body("continue", previous_response_id="resp_b"))
    cache_a2, a2 = await create(client, **body("continue", previous_response_id="resp_a"))
    results["chain_cache"] = [cache_a, cache_b, cache_a2]
    check(a.output_text != b.output_text, "A and B got the same answer")
    check(a2.output_text == a.output_text, "A's repeat differs")
    check([cache_a, cache_b, cache_a2] == ["MISS", "MISS", "HIT"], "previous_response_id is not keyed")


PHASES = {"herd": herd, "stream": streams, "cut": cut, "again": again, "chain": chain}


async def main() -> int:
    base_url, phase = sys.argv[1], sys.argv[2]
    results = {"sdk_version": openai.__version__, "phase": phase}
    # No retries: a retry would hide a failed call and add one to the mock's count.
    client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-test-sdk", max_retries=0, timeout=30)

    async def body(check):
        try:
            if not hasattr(client, "responses"):
                check(False, f"openai {openai.__version__} has no Responses API")
            else:
                await PHASES[phase](client, results, check)
        finally:
            await client.close()

    return await run_phase(phase, results, body)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
