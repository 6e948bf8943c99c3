"""Drives corral as apps written for Anthropic's and Google's own APIs do, while
corral's members are Vertex AI accounts; run by tests/it/vertex.rs.

Usage: python3 vertex_members.py BASE_URL MODE KEY [N]
  BASE_URL  corral's `/v1` URL (the SDKs are given its root)
  MODE      `claude`:      anthropic.Anthropic messages.create and messages.stream;
            `claude_herd`: N identical messages.create calls at once;
            `gemini`:      google-genai generate_content and generate_content_stream.
  KEY       the caller's key (corral's tenant; the members use their own
            service account)

Prints one JSON line of what the SDKs parsed.
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

CLAUDE = "claude-sonnet-4-5"
GEMINI = "gemini-2.5-flash"


def claude_client(root, key):
    import anthropic

    return anthropic.Anthropic(base_url=root, api_key=key, max_retries=0, timeout=30)


def claude(root, key):
    import anthropic

    client = claude_client(root, key)
    answer = client.messages.create(
        model=CLAUDE,
        max_tokens=64,
        messages=[{"role": "user", "content": "Hello, Claude on Vertex."}],
    )
    assert isinstance(answer, anthropic.types.Message), type(answer)
    with client.messages.stream(
        model=CLAUDE,
        max_tokens=64,
        messages=[{"role": "user", "content": "Stream from Claude on Vertex."}],
    ) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_message()
    assert isinstance(final, anthropic.types.Message), type(final)
    return {
        "text": answer.content[0].text,
        "model": answer.model,
        "stop_reason": answer.stop_reason,
        "input_tokens": answer.usage.input_tokens,
        "stream_types": types,
        "stream_text": final.content[0].text,
        "stream_stop_reason": final.stop_reason,
        "stream_output_tokens": final.usage.output_tokens,
    }


def claude_herd(root, key, n):
    client = claude_client(root, key)

    def one(_):
        raw = client.messages.with_raw_response.create(
            model=CLAUDE,
            max_tokens=64,
            messages=[{"role": "user", "content": "A herd at Claude on Vertex."}],
        )
        answer = raw.parse()
        return {"text": answer.content[0].text, "cache": raw.headers.get("x-corral-cache")}

    with ThreadPoolExecutor(max_workers=n) as pool:
        answers = list(pool.map(one, range(n)))
    return {"herd": answers}


def gemini(root, key):
    from google import genai
    from google.genai import types

    client = genai.Client(
        api_key=key, http_options=types.HttpOptions(base_url=root, timeout=30_000)
    )
    answer = client.models.generate_content(model=GEMINI, contents="Hello, Gemini on Vertex.")
    assert isinstance(answer, types.GenerateContentResponse), type(answer)
    chunks = list(
        client.models.generate_content_stream(model=GEMINI, contents="Stream from Gemini on Vertex.")
    )
    return {
        "text": answer.text,
        "model_version": answer.model_version,
        "finish_reason": str(answer.candidates[0].finish_reason),
        "prompt_tokens": answer.usage_metadata.prompt_token_count,
        "stream_chunks": len(chunks),
        "stream_text": "".join(chunk.text or "" for chunk in chunks),
        "stream_finish_reason": str(chunks[-1].candidates[0].finish_reason),
    }


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    base_url, mode, key = sys.argv[1:4]
    root = base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url
    if mode == "claude":
        results = claude(root, key)
    elif mode == "claude_herd":
        results = claude_herd(root, key, int(sys.argv[4]))
    elif mode == "gemini":
        results = gemini(root, key)
    else:
        sys.exit(f"unknown mode {mode!r}\n{__doc__}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
