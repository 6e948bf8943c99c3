"""Drives corral's Gemini generateContent with Google's google-genai SDK; run by tests/it/gemini.rs.

Usage: python3 gemini_herd.py BASE_URL PHASE   (BASE_URL e.g. http://127.0.0.1:PORT/v1; the SDK's
base URL is the root, it adds its version and `models/{model}:{method}` itself)

Each phase is one step of the Rust test, which holds and releases the mock provider around it (so a
herd overlaps by construction, not by luck) and counts the upstream calls:

- herd:    100 concurrent identical `generate_content` calls at temperature 0, then one repeat.
- stream:  100 concurrent identical `generate_content_stream` calls, then the same prompt
           non-streamed.
- mixed:   50 streamed and 50 non-streamed callers of one new prompt.
- cut:     100 concurrent streams of a new prompt whose upstream stream is cut: each must end in
           the SDK's own error.
- keys:    one prompt with one key, then with another (the `?key=` form is the Rust test's own).
- embed:   `embed_content` of 10 contents, then of 10 of which 9 are the same.

Prints one JSON line of what the SDK saw and exits non-zero if a check failed.
"""

import asyncio
import sys

from google import genai
from google.genai import errors, types
from phase_runner import run_phase

MODEL = "gemini-2.5-flash"
KEY = "AIza-GEMINICANARY-7d1e"
OTHER_KEY = "AIza-OTHERTENANT-42"


def client(root, key=KEY):
    """A client with the SDK's own retries off."""
    options = dict(base_url=root, timeout=60_000, retry_options=types.HttpRetryOptions(attempts=1))
    return genai.Client(api_key=key, http_options=types.HttpOptions(**options))


CONFIG = types.GenerateContentConfig(temperature=0)
# The herd's prompt thinks and reads cached content: its usage has every kind corral bills.
HERD_CONFIG = types.GenerateContentConfig(
    temperature=0,
    thinking_config=types.ThinkingConfig(thinking_budget=64),
    cached_content="cachedContents/corral-herd",
)


def cache_of(response):
    """corral's x-corral-cache header as the SDK kept it."""
    http = getattr(response, "sdk_http_response", None)
    headers = (http.headers if http is not None else None) or {}
    return {name.lower(): value for name, value in headers.items()}.get("x-corral-cache")


async def generate(client, text, config=CONFIG):
    response = await client.aio.models.generate_content(model=MODEL, contents=text, config=config)
    return cache_of(response), response.text, response.usage_metadata


async def stream(client, text):
    """(cache status, joined text, finish reason of the last chunk, error name or None)."""
    pieces, cache, finish = [], None, None
    try:
        async for chunk in await client.aio.models.generate_content_stream(
            model=MODEL, contents=text, config=CONFIG
        ):
            cache = cache or cache_of(chunk)
            if chunk.text:
                pieces.append(chunk.text)
            if chunk.candidates and chunk.candidates[0].finish_reason:
                finish = str(chunk.candidates[0].finish_reason)
    except errors.APIError as error:
        return cache, "".join(pieces), finish, f"{type(error).__name__}:{error.code}"
    return cache, "".join(pieces), finish, None


async def main(root, phase):
    results = {"phase": phase}
    main_client = client(root)

    async def herd(check):
        calls = await asyncio.gather(
            *(generate(main_client, "What is a corral?", HERD_CONFIG) for _ in range(100))
        )
        results["herd_texts"] = len({text for _, text, _ in calls})
        results["herd_misses"] = sum(1 for cache, _, _ in calls if cache == "MISS")
        results["herd_statuses"] = sorted({cache or "-" for cache, _, _ in calls})
        results["herd_text"] = calls[0][1]
        check(all(text for _, text, _ in calls), "every caller got text")
        cache, text, usage = await generate(main_client, "What is a corral?", HERD_CONFIG)
        results["repeat_cache"] = cache
        check(text == calls[0][1], "the repeat is the same answer")
        results["usage"] = usage.model_dump(exclude_none=True, mode="json")

    async def streams(check):
        calls = await asyncio.gather(*(stream(main_client, "Tell me about herds.") for _ in range(100)))
        results["stream_texts"] = len({text for _, text, _, _ in calls})
        results["stream_misses"] = sum(1 for cache, _, _, _ in calls if cache == "MISS")
        results["stream_errors"] = sorted({error for _, _, _, error in calls if error})
        results["stream_finish"] = sorted({finish or "-" for _, _, finish, _ in calls})
        results["stream_text"] = calls[0][1]
        check(all(text for _, text, _, _ in calls), "every stream had text")
        cache, text, _ = await generate(main_client, "Tell me about herds.")
        results["after_stream_cache"] = cache
        check(text == calls[0][1], "the non-stream answer is the stream's text")

    async def mixed(check):
        prompt = "One call for both kinds of caller."
        calls = await asyncio.gather(
            *(stream(main_client, prompt) for _ in range(50)),
            *(generate(main_client, prompt) for _ in range(50)),
        )
        texts = {call[1] for call in calls}
        results["mixed_texts"] = len(texts)
        check(all(call[1] for call in calls), "every caller got text")
        check(all(call[3] is None for call in calls[:50]), "no stream failed")

    async def cut(check):
        calls = await asyncio.gather(*(stream(main_client, "A stream that breaks.") for _ in range(100)))
        results["cut_errors"] = sorted({error or "none" for _, _, _, error in calls})

    async def keys(check):
        first = await generate(main_client, "Whose answer is this?")
        other = await generate(client(root, key=OTHER_KEY), "Whose answer is this?")
        results["keys"] = [first[0], other[0]]

    async def embed(check):
        model = "gemini-embedding-001"
        texts = [f"document {i}" for i in range(10)]
        first = await main_client.aio.models.embed_content(model=model, contents=texts)
        # Nine of the ten already embedded, one new.
        second_texts = texts[:9] + ["a new document"]
        second = await main_client.aio.models.embed_content(model=model, contents=second_texts)
        first_values = [e.values for e in first.embeddings]
        second_values = [e.values for e in second.embeddings]
        results["embed_counts"] = [len(first_values), len(second_values)]
        check(first_values[:9] == second_values[:9], "the nine shared contents have the same vectors")
        check(second_values[9] not in first_values, "the new content has its own vector")
        check(all(values for values in second_values), "every content has a vector")

    bodies = {"herd": herd, "stream": streams, "mixed": mixed, "cut": cut, "keys": keys, "embed": embed}
    return await run_phase(phase, results, bodies[phase])


if __name__ == "__main__":
    base_url, phase = sys.argv[1], sys.argv[2]
    root = base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url
    sys.exit(asyncio.run(main(root, phase)))
