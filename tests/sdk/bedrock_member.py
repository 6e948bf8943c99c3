"""Drives corral, in front of a Bedrock member, with the official Anthropic Python SDK's own
client (`anthropic.Anthropic`: the caller does not know that Bedrock answers); run by
tests/it/bedrock.rs.

Usage: python3 bedrock_member.py BASE_URL   (BASE_URL e.g. http://127.0.0.1:PORT/v1; the SDK's
own base URL is the host, it adds /v1/messages itself)

One prompt, asked by two callers with different keys (two tenants: neither is served the other's
answer, so both calls reach the member): `messages.create` by one, `messages.stream` by the other.
Prints one JSON line of what the SDK saw; an exception exits non-zero with its traceback.
"""

import json
import sys

import anthropic

MODEL = "claude-sonnet-4-5"
REQUEST = dict(
    model=MODEL,
    max_tokens=256,
    system="Be terse.",
    messages=[{"role": "user", "content": "Tell me about Bedrock, through corral."}],
)


def client(base_url, key):
    # The SDK's own retries are off: the Rust test counts the calls corral made.
    return anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0, timeout=30)


def text_of(message):
    return "".join(block.text for block in message.content if block.type == "text")


def main():
    base_url = sys.argv[1].removesuffix("/").removesuffix("/v1")
    results = {"sdk_version": anthropic.__version__}

    raw = client(base_url, "sk-ant-caller-plain").messages.with_raw_response.create(**REQUEST)
    plain = raw.parse()
    results["plain_cache"] = raw.headers.get("x-corral-cache")
    results["plain_text"] = text_of(plain)
    results["plain_stop_reason"] = plain.stop_reason
    results["plain_usage"] = [plain.usage.input_tokens, plain.usage.output_tokens]

    types, deltas = [], []
    with client(base_url, "sk-ant-caller-stream").messages.stream(**REQUEST) as stream:
        results["stream_cache"] = stream.response.headers.get("x-corral-cache")
        for event in stream:
            types.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                deltas.append(event.delta.text)
        final = stream.get_final_message()
    results["stream_types"] = types
    results["stream_text"] = "".join(deltas)
    results["final_text"] = text_of(final)
    results["final_stop_reason"] = final.stop_reason
    results["final_usage"] = [final.usage.input_tokens, final.usage.output_tokens]
    print(json.dumps(results))


if __name__ == "__main__":
    main()
