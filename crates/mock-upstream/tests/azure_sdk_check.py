"""Check the mock's Azure OpenAI surface against the official `openai` Python SDK's own types.

Usage: python3 azure_sdk_check.py http://127.0.0.1:PORT [API_KEY]

PORT is a running mock-upstream (its ready line names the address); API_KEY is one the mock
accepts (`--azure-key`, or any non-empty key when it was started without one; default "test-key").
The mock's Entra endpoint must issue tokens to any client, or to client id "sdk-check" with
secret "sdk-check-secret". Exits non-zero with a traceback on the first mismatch, and prints
"N passed, 0 failed" when every check passed.

What it proves: the SDK's Azure client (`AzureOpenAI`, api-version 2024-10-21) and its plain
client on the v1 path parse every answer into the SDK's types (`ChatCompletion`,
`ChatCompletionChunk`, the choice-less opening chunk and the delta-less annotation chunks
included, `CreateEmbeddingResponse`), read Azure's annotations from them, and raise
`BadRequestError` with code `content_filter` for a prompt the filter refuses.
"""

import json
import sys
import urllib.parse
import urllib.request

import openai
from openai import AzureOpenAI, OpenAI
from openai.types import CreateEmbeddingResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk

API_VERSION = "2024-10-21"
CHAT_DEPLOYMENT = "chat-deployment"
EMBEDDING_DEPLOYMENT = "embedding-deployment"
CHAT_SNAPSHOT = "gpt-4o-2024-11-20"
EMBEDDING_SNAPSHOT = "text-embedding-3-small"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hello from the SDK check"},
]

checks = []


def check(function):
    checks.append(function)
    return function


def extra(model, name):
    """A field the SDK's type does not declare (Azure's annotations), as the SDK kept it."""
    value = (model.model_extra or {}).get(name)
    assert value is not None, f"{type(model).__name__} lacks {name}: {model!r}"
    return value


def assert_clean_prompt(results):
    assert isinstance(results, list) and results[0]["prompt_index"] == 0, results
    categories = results[0]["content_filter_results"]
    for category in ("hate", "self_harm", "sexual", "violence"):
        assert categories[category] == {"filtered": False, "severity": "safe"}, categories


def stream_parts(chunks):
    """(opening chunk, content text, finish reasons, annotation chunks, usage) of a stream."""
    opening, *rest = chunks
    text, finishes, annotations, usage = "", [], [], None
    for chunk in rest:
        assert isinstance(chunk, ChatCompletionChunk), type(chunk)
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if chunk.id == "":
                annotations.append(chunk)
                # Azure's annotation chunks carry no delta; the SDK keeps it unset.
                assert getattr(choice, "delta", None) is None, choice
                assert choice.finish_reason is None, choice
                extra(choice, "content_filter_results")
                extra(choice, "content_filter_offsets")
                continue
            assert chunk.model == CHAT_SNAPSHOT, chunk.model
            extra(choice, "content_filter_results")
            text += choice.delta.content or ""
            if choice.finish_reason is not None:
                finishes.append(choice.finish_reason)
    return opening, text, finishes, annotations, usage


def chat_plain(client, model):
    completion = client.chat.completions.create(model=model, messages=MESSAGES)
    assert isinstance(completion, ChatCompletion), type(completion)
    assert completion.model == CHAT_SNAPSHOT, completion.model
    assert_clean_prompt(extra(completion, "prompt_filter_results"))
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice.finish_reason
    filters = extra(choice, "content_filter_results")
    assert filters["violence"] == {"filtered": False, "severity": "safe"}, filters
    assert choice.message.content.startswith("mock reply to "), choice.message.content
    return completion


def chat_streamed(client, model, expected_text):
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    opening, text, finishes, annotations, usage = stream_parts(chunks)
    assert isinstance(opening, ChatCompletionChunk), type(opening)
    assert opening.choices == [] and opening.id == "" and opening.model == "", opening
    assert_clean_prompt(extra(opening, "prompt_filter_results"))
    assert text == expected_text, (text, expected_text)
    assert finishes == ["stop"], finishes
    assert len(annotations) == 1, annotations
    assert usage is not None and usage.total_tokens > 0, usage


def azure_client(base_url, **credential):
    return AzureOpenAI(azure_endpoint=base_url, api_version=API_VERSION, **credential)


def entra_token(base_url):
    form = urllib.parse.urlencode(
        {
            "grant_type": "client_credentials",
            "client_id": "sdk-check",
            "client_secret": "sdk-check-secret",
            "scope": "https://cognitiveservices.azure.com/.default",
        }
    ).encode()
    request = urllib.request.Request(f"{base_url}/sdk-check-tenant/oauth2/v2.0/token", data=form)
    # No proxy from the environment may intercept a loopback call.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=10) as response:
        body = json.load(response)
    assert body["token_type"] == "Bearer" and body["expires_in"] > 0, body
    return body["access_token"]


@check
def versioned_chat_plain_and_streamed(base_url, key):
    client = azure_client(base_url, api_key=key)
    completion = chat_plain(client, CHAT_DEPLOYMENT)
    chat_streamed(client, CHAT_DEPLOYMENT, completion.choices[0].message.content)


@check
def versioned_embeddings(base_url, key):
    client = azure_client(base_url, api_key=key)
    # The SDK asks for base64 and decodes it back to floats.
    answer = client.embeddings.create(model=EMBEDDING_DEPLOYMENT, input=["one", "two"])
    assert isinstance(answer, CreateEmbeddingResponse), type(answer)
    assert answer.model == EMBEDDING_SNAPSHOT, answer.model
    assert [item.index for item in answer.data] == [0, 1], answer.data
    assert all(len(item.embedding) == 8 for item in answer.data), answer.data
    assert all(isinstance(x, float) for x in answer.data[0].embedding), answer.data[0]
    assert answer.data[0].embedding != answer.data[1].embedding


@check
def versioned_content_filter_400(base_url, key):
    client = azure_client(base_url, api_key=key)
    try:
        client.chat.completions.create(
            model=CHAT_DEPLOYMENT,
            messages=[{"role": "user", "content": "please [[content_filter_400]]"}],
        )
    except openai.BadRequestError as error:
        assert error.status_code == 400, error.status_code
        assert error.code == "content_filter", error.code
        assert error.param == "prompt", error.param
        inner = error.body["innererror"]
        assert inner["code"] == "ResponsibleAIPolicyViolation", inner
        assert inner["content_filter_result"]["violence"]["filtered"] is True, inner
    else:
        raise AssertionError("a filtered prompt must raise BadRequestError")


@check
def versioned_content_filter_finish(base_url, key):
    client = azure_client(base_url, api_key=key)
    messages = [{"role": "user", "content": "please [[content_filter_finish]]"}]
    completion = client.chat.completions.create(model=CHAT_DEPLOYMENT, messages=messages)
    choice = completion.choices[0]
    assert choice.finish_reason == "content_filter", choice.finish_reason
    assert extra(choice, "content_filter_results")["violence"]["filtered"] is True
    chunks = list(
        client.chat.completions.create(model=CHAT_DEPLOYMENT, messages=messages, stream=True)
    )
    _, _, finishes, annotations, _ = stream_parts(chunks)
    assert finishes == ["content_filter"], finishes
    assert len(annotations) == 1, annotations


@check
def versioned_chat_with_entra_token(base_url, key):
    client = azure_client(base_url, azure_ad_token=entra_token(base_url))
    chat_plain(client, CHAT_DEPLOYMENT)


@check
def a_bearer_that_is_no_issued_token_is_refused(base_url, key):
    # The SDK sends an azure_ad_token as `Authorization: Bearer`; an API key sent that way
    # must not open the door.
    client = azure_client(base_url, azure_ad_token=key, max_retries=0)
    try:
        client.chat.completions.create(model=CHAT_DEPLOYMENT, messages=MESSAGES)
    except openai.AuthenticationError as error:
        assert error.status_code == 401 and error.code == "401", (error.status_code, error.code)
    else:
        raise AssertionError("an API key as a bearer must be refused")


@check
def v1_chat_and_embeddings_with_the_plain_client(base_url, key):
    # The plain client sends its api_key as a bearer: an issued token. An API key goes in
    # Azure's own header.
    by_token = OpenAI(base_url=f"{base_url}/openai/v1", api_key=entra_token(base_url))
    by_key = OpenAI(
        base_url=f"{base_url}/openai/v1",
        api_key="unused",
        default_headers={"api-key": key},
    )
    for client in (by_token, by_key):
        completion = chat_plain(client, CHAT_DEPLOYMENT)
        chat_streamed(client, CHAT_DEPLOYMENT, completion.choices[0].message.content)
        answer = client.embeddings.create(model=EMBEDDING_DEPLOYMENT, input="one")
        assert isinstance(answer, CreateEmbeddingResponse), type(answer)
        assert answer.model == EMBEDDING_SNAPSHOT, answer.model


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    base_url = sys.argv[1].rstrip("/")
    # The ready line names the OpenAI base URL; Azure's endpoint is the origin.
    base_url = base_url.removesuffix("/v1")
    key = sys.argv[2] if len(sys.argv) == 3 else "test-key"
    for function in checks:
        function(base_url, key)
        print(f"ok {function.__name__}")
    print(f"{len(checks)} passed, 0 failed")


if __name__ == "__main__":
    main()
