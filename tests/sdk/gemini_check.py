"""Google's google-genai SDK against a corral with no `api: gemini` upstream.

Every call must fail with the SDK's own error type (`errors.ClientError`, code
404, status NOT_FOUND): corral answers Gemini's native API in Gemini's error
shape and sends it nowhere. Prints one JSON line: each call's outcome.
"""

import json
import sys

from google import genai
from google.genai import errors, types

base_url = sys.argv[1]
# The harness passes corral's `/v1`; the SDK wants the root and adds its version.
root = base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url
client = genai.Client(
    api_key="AIza-GEMINICANARY-7d1e",
    http_options=types.HttpOptions(base_url=root, timeout=20_000),
)

results = {}


def attempt(name, call):
    try:
        call()
        results[name] = {"type": "none"}
    except errors.APIError as error:
        results[name] = {
            "type": type(error).__name__,
            "code": error.code,
            "status": error.status,
            "message": error.message,
        }
    except Exception as error:  # noqa: BLE001 - reported, not hidden
        results[name] = {"type": type(error).__name__, "other": str(error)[:400]}


attempt(
    "generate",
    lambda: client.models.generate_content(model="gemini-2.5-flash", contents="hello"),
)
attempt(
    "stream",
    lambda: list(
        client.models.generate_content_stream(model="gemini-2.5-flash", contents="hello")
    ),
)
attempt("count_tokens", lambda: client.models.count_tokens(model="gemini-2.5-flash", contents="hello"))
attempt("list", lambda: list(client.models.list()))
attempt(
    "embed",
    lambda: client.models.embed_content(model="text-embedding-004", contents=["a", "b"]),
)
print(json.dumps(results))
