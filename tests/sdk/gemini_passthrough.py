"""Google's google-genai SDK against a corral with an `api: gemini` upstream
(the mock): count_tokens, models.list and generate_content go through.
Prints one JSON line with what each returned.
"""

import json
import sys

from google import genai
from google.genai import types

base_url = sys.argv[1]
root = base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url
client = genai.Client(
    api_key="AIza-GEMINICANARY-7d1e",
    http_options=types.HttpOptions(base_url=root, timeout=20_000),
)

counted = client.models.count_tokens(model="gemini-2.5-flash", contents="hello there")
models = [model.name for model in client.models.list()]
answer = client.models.generate_content(model="gemini-2.5-flash", contents="hello there")
print(
    json.dumps(
        {"total_tokens": counted.total_tokens, "models": models, "text": answer.text}
    )
)
