"""One chat call with the OpenAI Python SDK's default retries; run by tests/it/edges.rs.

Usage: python3 openai_retry.py BASE_URL

The provider behind corral always answers 429 with Retry-After. Prints one JSON
line: the status the SDK raised, and the x-should-retry and Retry-After headers
of corral's final answer. The Rust side counts the attempts at the mock.
"""

import json
import sys

import openai


def main() -> int:
    # The SDK's default: two retries of its own on a 429.
    client = openai.OpenAI(base_url=sys.argv[1], api_key="sk-test-sdk", max_retries=2, timeout=60)
    result = {}
    try:
        client.chat.completions.create(
            model="gpt-4o-mini",
            temperature=0,
            messages=[{"role": "user", "content": "Never answered."}],
        )
        result["error"] = None
    except openai.APIStatusError as error:
        result["error"] = type(error).__name__
        result["status"] = error.status_code
        result["x_should_retry"] = error.response.headers.get("x-should-retry")
        result["retry_after"] = error.response.headers.get("retry-after")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
