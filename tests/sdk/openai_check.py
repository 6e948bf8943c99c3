"""Drives corral with the official OpenAI Python SDK; run by tests/it/sdk.rs.

Usage: python3 openai_check.py BASE_URL   (e.g. http://127.0.0.1:PORT/v1)

Prints one JSON line of what the SDK saw and exits non-zero if any check
failed. The Rust test asserts on the JSON too, so a failure here names the
check and the Rust side can still show every value that was observed.
"""

import json
import sys
import traceback

import openai

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say hello to the SDK test."},
]
# Streamed first, so the stream is live from upstream rather than replayed.
LIVE_MESSAGES = [{"role": "user", "content": "Stream a fresh answer to the SDK test."}]


def main() -> int:
    base_url = sys.argv[1]
    # No retries: a retry would hide a failed call and add one to the mock's count.
    client = openai.OpenAI(base_url=base_url, api_key="sk-test-sdk", max_retries=0, timeout=20)
    results = {"sdk_version": openai.__version__}
    failures = []

    def check(ok, what):
        if not ok:
            failures.append(what)

    def step(name, run):
        try:
            run()
        except Exception as err:  # noqa: BLE001 - every failure is reported, not raised
            traceback.print_exc(file=sys.stderr)
            failures.append(f"{name}: {type(err).__name__}: {err}")

    def chat():
        completion = client.chat.completions.create(
            model="gpt-4o-mini", temperature=0, messages=MESSAGES
        )
        results["chat_content"] = completion.choices[0].message.content
        check(bool(results["chat_content"]), "chat content is empty")

    def repeat():
        # The raw response exposes the headers; `parse()` gives the usual object.
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini", temperature=0, messages=MESSAGES
        )
        results["repeat_cache"] = raw.headers.get("x-corral-cache")
        results["repeat_content"] = raw.parse().choices[0].message.content
        check(results["repeat_cache"] == "HIT", "the repeat was not a cache HIT")
        check(
            results["repeat_content"] == results.get("chat_content"),
            "the repeat's content differs from the first call's",
        )

    def stream():
        parts = []
        chunks = 0
        for chunk in client.chat.completions.create(
            model="gpt-4o-mini", temperature=0, messages=MESSAGES, stream=True
        ):
            chunks += 1
            # A usage-only chunk has no choices.
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
        results["stream_chunks"] = chunks
        results["stream_content"] = "".join(parts)
        check(
            results["stream_content"] == results.get("chat_content"),
            "the streamed content differs from the non-streamed content",
        )

    def live_stream():
        parts = []
        for chunk in client.chat.completions.create(
            model="gpt-4o-mini",
            temperature=0,
            messages=LIVE_MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                results["live_usage_total"] = chunk.usage.total_tokens
        results["live_stream_content"] = "".join(parts)
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini", temperature=0, messages=LIVE_MESSAGES
        )
        results["live_repeat_cache"] = raw.headers.get("x-corral-cache")
        results["live_repeat_content"] = raw.parse().choices[0].message.content
        check(
            results["live_stream_content"] == results["live_repeat_content"],
            "the cached answer of a stream differs from the stream",
        )

    def embeddings():
        response = client.embeddings.create(model="text-embedding-3-small", input="hello")
        vector = response.data[0].embedding
        results["embedding_len"] = len(vector)
        check(len(vector) > 0, "the embedding is empty")
        check(all(isinstance(v, float) for v in vector), "the embedding is not floats")

    def bad_request():
        # corral rejects an empty model with a 400 before anything goes upstream.
        try:
            client.chat.completions.create(model="", messages=MESSAGES)
        except openai.APIStatusError as err:
            results["bad_request_error"] = type(err).__name__
            results["bad_request_status"] = err.status_code
            check(
                isinstance(err, openai.BadRequestError),
                f"expected BadRequestError, got {type(err).__name__}",
            )
        else:
            results["bad_request_error"] = None
            failures.append("an empty model was accepted")

    step("chat", chat)
    step("repeat", repeat)
    step("stream", stream)
    step("live_stream", live_stream)
    step("embeddings", embeddings)
    step("bad_request", bad_request)

    results["failures"] = failures
    print(json.dumps(results), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
