"""Drives corral's Anthropic Messages API with the official Anthropic Python SDK; run by
tests/it/anthropic_sdk.rs.

Usage: python3 anthropic_check.py BASE_URL PHASE   (BASE_URL e.g. http://127.0.0.1:PORT/v1; the
SDK's own base URL is the host, it adds /v1/messages itself)

Each phase is one step of the Rust test, which holds and releases the mock provider around it (so a
herd overlaps by construction, not by luck) and counts the upstream calls:

- herd:      100 concurrent identical `messages.create` calls, then one repeat.
- stream:    100 concurrent identical `messages.stream` calls, then the same prompt non-streamed.
- tenants:   one prompt sent at once with two different API keys.
- same_key:  one key sent as `x-api-key`, then as `Authorization: Bearer` (the SDK's `api_key`).
- overload:  one call while the provider answers 529 once (the SDK's own retries are off).
- bad:       requests the provider refuses (400, in Anthropic's error shape): corral passes the
             provider's own rules to the provider and relays its answer as it came.
- auth:      against a gateway with gateway keys: a wrong key, then a right one.

Two clients: `x_api_key` sends its key as `x-api-key` (older SDKs, curl, coding agents); `bearer`
uses the SDK's `api_key`, which the 2.x SDK sends as `Authorization: Bearer`. Prints one JSON line
of what the SDK saw and exits non-zero if a check failed.
"""

import asyncio
import json
import sys

import anthropic
from phase_runner import run_phase

MODEL = "claude-sonnet-4-5"


def body(text, **extra):
    """A request as the 2.x SDK sends it: without temperature (it has no such parameter), so
    corral treats it as sampled; the Rust test's gateway stores sampled answers."""
    return dict(
        model=MODEL,
        max_tokens=256,
        system="Be terse.",
        messages=[{"role": "user", "content": text}],
        **extra,
    )


def client(base_url, key, header):
    """A client that sends `key` as `x-api-key` or as the SDK's own `api_key`."""
    common = dict(base_url=base_url, max_retries=0, timeout=30)
    if header == "x-api-key":
        return anthropic.AsyncAnthropic(api_key=None, auth_token=None, default_headers={"x-api-key": key}, **common)
    return anthropic.AsyncAnthropic(api_key=key, **common)


def summary(message):
    """What a caller compares of a message: everything but the SDK's own types."""
    return {
        "id": message.id,
        "model": message.model,
        "role": message.role,
        "stop_reason": message.stop_reason,
        "stop_sequence": message.stop_sequence,
        "content": [(block.type, getattr(block, "text", None)) for block in message.content],
        "usage": message.usage.model_dump(exclude_none=True),
    }


async def create(client, **kwargs):
    """One non-stream call: (x-corral-cache, the Message)."""
    raw = await client.messages.with_raw_response.create(**kwargs)
    return raw.headers.get("x-corral-cache"), await raw.parse()


async def stream(client, **kwargs):
    """One `messages.stream` call: (x-corral-cache, event types, text, final message, error)."""
    types, text = [], []
    try:
        async with client.messages.stream(**kwargs) as events:
            cache = events.response.headers.get("x-corral-cache")
            async for event in events:
                types.append(event.type)
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    text.append(event.delta.text)
            final = await events.get_final_message()
    except Exception as err:  # noqa: BLE001 - reported, not raised
        return None, types, "".join(text), None, f"{type(err).__name__}: {err}"
    return cache, types, "".join(text), final, None


async def herd(clients, results, check):
    answers = await asyncio.gather(*[create(clients["x_api_key"], **body("a herd of a hundred")) for _ in range(100)])
    texts = {message.content[0].text for _, message in answers}
    results["herd_texts"] = len(texts)
    results["herd_ids"] = len({message.id for _, message in answers})
    results["herd_misses"] = sum(1 for cache, _ in answers if cache == "MISS")
    results["herd_cache"] = sorted({cache for cache, _ in answers})
    check(len(texts) == 1 and all(texts), "the herd's answers differ or are empty")
    usage = answers[0][1].usage
    results["herd_usage"] = [usage.input_tokens, usage.output_tokens]
    cache, repeat = await create(clients["x_api_key"], **body("a herd of a hundred"))
    results["repeat_cache"] = cache
    check(cache == "HIT", f"the repeat was {cache}, not HIT")
    check(summary(repeat) == summary(answers[0][1]), "the repeat differs from the herd's answer")


async def streams(clients, results, check):
    outcomes = await asyncio.gather(*[stream(clients["x_api_key"], **body("a hundred streams")) for _ in range(100)])
    errors = [error for *_, error in outcomes if error]
    results["stream_errors"] = errors[:3]
    check(not errors, f"streams raised: {errors[:3]}")
    finals = {json.dumps(summary(final), sort_keys=True) for *_, final, _ in outcomes if final}
    sequences = {json.dumps(types) for _, types, *_ in outcomes}
    results["stream_finals"] = len(finals)
    results["stream_sequences"] = len(sequences)
    results["stream_misses"] = sum(1 for cache, *_ in outcomes if cache == "MISS")
    _, types, text, final, _ = outcomes[0]
    results["stream_types"] = [types[0], types[-1]] if types else []
    check(len(finals) == 1, "the callers' final messages differ")
    check(len(sequences) == 1, "the callers' event sequences differ")
    check(final is not None and final.content[0].text == text, "the deltas do not add up to the final text")
    # The same prompt without stream: the answer the stream stored.
    cache, plain = await create(clients["x_api_key"], **body("a hundred streams"))
    results["after_stream_cache"] = cache
    results["final_equals_plain"] = final is not None and summary(final) == summary(plain)
    check(results["final_equals_plain"], f"get_final_message() {summary(final) if final else None} != create() {summary(plain)}")


async def tenants(clients, results, check):
    a, b = await asyncio.gather(
        create(clients["x_api_key"], **body("whose answer is this?")),
        create(clients["other"], **body("whose answer is this?")),
    )
    results["tenants_cache"] = [a[0], b[0]]
    check([a[0], b[0]] == ["MISS", "MISS"], f"two keys shared an answer: {[a[0], b[0]]}")


async def same_key(clients, results, check):
    first, _ = await create(clients["x_api_key"], **body("one key, two headers"))
    second, _ = await create(clients["bearer"], **body("one key, two headers"))
    results["same_key_cache"] = [first, second]
    check([first, second] == ["MISS", "HIT"], f"one key in two headers is two tenants: {[first, second]}")


async def overload(clients, results, check):
    cache, message = await create(clients["bearer"], **body("are you overloaded?"))
    results["overload_cache"] = cache
    results["overload_text"] = message.content[0].text
    check(bool(message.content[0].text), "no answer after the 529")


async def bad(clients, results, check):
    refused = []
    for kwargs in [
        dict(body("hi"), messages=[{"role": "narrator", "content": "not a role here"}]),
        dict(body("hi"), extra_body={"temperature": 5}),
    ]:
        try:
            await clients["x_api_key"].messages.create(**kwargs)
            refused.append("accepted")
        except anthropic.APIStatusError as err:
            refused.append([type(err).__name__, err.status_code, err.body.get("type"), err.body["error"]["type"]])
    results["bad"] = refused
    expected = ["BadRequestError", 400, "error", "invalid_request_error"]
    check(refused == [expected, expected], f"refusals: {refused}")


async def auth(clients, results, check):
    try:
        await clients["wrong"].messages.create(**body("let me in"))
        results["auth_wrong"] = "accepted"
    except anthropic.APIStatusError as err:
        results["auth_wrong"] = [type(err).__name__, err.status_code, err.body["error"]["type"]]
    check(results["auth_wrong"] == ["AuthenticationError", 401, "authentication_error"], f"wrong key: {results['auth_wrong']}")
    cache, message = await create(clients["gateway"], **body("let me in"))
    results["auth_right"] = cache
    check(bool(message.content[0].text), "the gateway key was refused")


PHASES = {
    "herd": herd,
    "stream": streams,
    "tenants": tenants,
    "same_key": same_key,
    "overload": overload,
    "bad": bad,
    "auth": auth,
}


async def main() -> int:
    base_url, phase = sys.argv[1], sys.argv[2]
    base_url = base_url.removesuffix("/").removesuffix("/v1")
    results = {"sdk_version": anthropic.__version__, "phase": phase}
    clients = {
        "x_api_key": client(base_url, "sk-ant-caller-a", "x-api-key"),
        "other": client(base_url, "sk-ant-caller-b", "x-api-key"),
        "bearer": client(base_url, "sk-ant-caller-a", "api_key"),
        "wrong": client(base_url, "gw-wrong", "x-api-key"),
        "gateway": client(base_url, "gw-sdk-key", "x-api-key"),
    }

    async def body(check):
        try:
            await PHASES[phase](clients, results, check)
        finally:
            for each in clients.values():
                await each.close()

    return await run_phase(phase, results, body)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
