"""Google's google-genai SDK streams through corral while the provider is silent
for longer than corral's keep-alive interval (issue 37, R1).

Streams one request twice: first while the provider holds its first event (corral
keeps the reader alive meanwhile), then again, answered from corral's cache (a
replay). Prints one JSON line: each stream's text, chunk count and finish reason,
or the error the SDK raised.
"""

import json
import sys

from google import genai
from google.genai import types

base_url = sys.argv[1]
# The harness passes corral's `/v1`; the SDK wants the root and adds its version.
root = base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url
client = genai.Client(
    api_key="AIza-GEMINICANARY-7d1e",
    http_options=types.HttpOptions(base_url=root, timeout=60_000),
)
config = types.GenerateContentConfig(temperature=0)

results = {}
for name in ["held", "replayed"]:
    try:
        chunks = list(
            client.models.generate_content_stream(
                model="gemini-2.5-flash", contents="keep me alive", config=config
            )
        )
        reason = chunks[-1].candidates[0].finish_reason if chunks else None
        results[name] = {
            "text": "".join(chunk.text or "" for chunk in chunks),
            "chunks": len(chunks),
            # An enum in the SDK's types; its value is Google's word.
            "finish": getattr(reason, "value", reason),
        }
    except Exception as error:  # noqa: BLE001 - reported, not hidden
        results[name] = {"error": type(error).__name__, "message": str(error)[:400]}
print(json.dumps(results))
