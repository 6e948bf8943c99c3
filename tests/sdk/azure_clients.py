"""Drives corral as apps written for OpenAI and for Azure OpenAI do, with the
official `openai` SDK's `OpenAI` and `AzureOpenAI` clients; run by
tests/it/azure.rs.

Usage: python3 azure_clients.py BASE_URL MODE KEY [N]
  BASE_URL  corral's `/v1` URL (`AzureOpenAI` is given the root, as an app's
            `azure_endpoint`)
  MODE      `openai`: `OpenAI(base_url=...)` chat, plain and streamed, for gpt-4o;
            `azure`:  `AzureOpenAI(azure_endpoint=...)` chat (plain, streamed) and
                      embeddings, by deployment name;
            `azure_herd`: N identical `AzureOpenAI` chat calls at once (threads).
  KEY       the caller's key (`api-key` for AzureOpenAI, a bearer for OpenAI)

Prints one JSON line of what the SDK parsed; exits non-zero if a check failed.
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import openai

API_VERSION = "2024-10-21"
MESSAGES = [{"role": "user", "content": "Say hello to the Azure test."}]
HERD_MESSAGES = [{"role": "user", "content": "Say hello to the Azure herd."}]


def chunks_of(stream):
    """Every chunk as the SDK parsed it: its choices' count, whether it held
    Azure's prompt filter results, and its text."""
    seen = []
    for chunk in stream:
        assert isinstance(chunk, openai.types.chat.ChatCompletionChunk), type(chunk)
        extra = chunk.model_extra or {}
        text = "".join(
            (choice.delta.content or "") for choice in chunk.choices if choice.delta is not None
        )
        seen.append(
            {
                "choices": len(chunk.choices),
                "prompt_filter_results": "prompt_filter_results" in extra,
                "text": text,
                "usage": chunk.usage.total_tokens if chunk.usage else None,
            }
        )
    return seen


def chat(client, model, stream=False, messages=MESSAGES, **extra):
    if stream:
        return chunks_of(
            client.chat.completions.create(model=model, messages=messages, stream=True, **extra)
        )
    answer = client.chat.completions.create(model=model, messages=messages, **extra)
    assert isinstance(answer, openai.types.chat.ChatCompletion), type(answer)
    return {
        "content": answer.choices[0].message.content,
        "finish_reason": answer.choices[0].finish_reason,
        "total_tokens": answer.usage.total_tokens if answer.usage else None,
    }


def main() -> int:
    base_url, mode, key = sys.argv[1], sys.argv[2], sys.argv[3]
    root = base_url.removesuffix("/v1")
    results = {"sdk_version": openai.__version__}
    if mode == "openai":
        client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=30)
        results["plain"] = chat(client, "gpt-4o")
        results["streamed"] = chat(client, "gpt-4o", stream=True, temperature=0.5, seed=7)
    elif mode in ("azure", "azure_herd"):
        client = openai.AzureOpenAI(
            azure_endpoint=root, api_version=API_VERSION, api_key=key, max_retries=0, timeout=30
        )
        if mode == "azure":
            results["plain"] = chat(client, "gpt-4o", temperature=0)
            results["streamed"] = chat(client, "gpt-4o", stream=True, temperature=0.5, seed=7)
            embedded = client.embeddings.create(
                model="text-embedding-3-small", input=["one", "two"]
            )
            assert isinstance(embedded, openai.types.CreateEmbeddingResponse), type(embedded)
            results["embeddings"] = [len(item.embedding) for item in embedded.data]
        else:
            n = int(sys.argv[4])
            with ThreadPoolExecutor(max_workers=n) as pool:
                answers = list(pool.map(lambda _: chat(client, "gpt-4o", messages=HERD_MESSAGES), range(n)))
            results["herd"] = [answer["content"] for answer in answers]
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
