"""The OpenAI Python SDK retrying over a slow provider; run by tests/it/sdk.rs.

Usage: python3 openai_slow_retry.py BASE_URL   (e.g. http://127.0.0.1:PORT/v1)

The provider takes longer than the SDK's timeout, so the first attempt times
out and the SDK retries (marking the retry with X-Stainless-Retry-Count). The
call must succeed; the Rust test checks the provider was called once. Prints
one JSON line of what the SDK saw; exits non-zero if the call failed.
"""

import json
import sys
import traceback

import openai


def main() -> int:
    base_url = sys.argv[1]
    client = openai.OpenAI(base_url=base_url, api_key="sk-test-retry", timeout=1.0, max_retries=2)
    try:
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini",
            temperature=1,
            messages=[{"role": "user", "content": "Answer slowly; I will retry."}],
        )
        completion = raw.parse()
    except Exception as err:  # noqa: BLE001 - reported, then a non-zero exit
        traceback.print_exc(file=sys.stderr)
        print(json.dumps({"error": f"{type(err).__name__}: {err}"}))
        return 1
    print(
        json.dumps(
            {
                "sdk_version": openai.__version__,
                "content": completion.choices[0].message.content,
                "retries_taken": getattr(raw, "retries_taken", None),
                "cache": raw.headers.get("x-corral-cache"),
                "cache_status": raw.headers.get("cache-status"),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
