"""Check the mock's Vertex AI surface against the official Python SDKs' own parsing.

Usage: python3 vertex_sdk_check.py http://127.0.0.1:PORT SERVICE_ACCOUNT_JSON

PORT is a running mock-upstream (its ready line names the address; a trailing `/v1` is
ignored); SERVICE_ACCOUNT_JSON is the key file it wrote with `--google-service-account-file`.
Exits non-zero with a traceback on the first mismatch, and prints "N passed, 0 failed" when
every check passed.

Tested with (pip): anthropic[vertex]==2.17.0 google-genai==3.6.1 (google-auth==2.63.1 comes
with them), and with anthropic[vertex]==0.121.0. The 0.x Vertex client sends
`"anthropic_version": "vertex-2023-10-16"`; the 2.x releases send their Messages API version
("2026-10-21") there instead, and the mock accepts both (`VERTEX_ANTHROPIC_VERSIONS`).

What it proves: `google.oauth2.service_account.Credentials` reads the mock's key file and trades
its signed assertion for a token at the mock's `/token`; `anthropic.AnthropicVertex` sends
`messages.create` and `messages.stream` by Vertex's `rawPredict` / `streamRawPredict` paths with
that token and parses the answers into its `Message` and stream events; `google.genai.Client`
in Vertex mode does the same for `generate_content` and `generate_content_stream`, by the
default `v1beta1` path and by `v1`; and a call without a valid token raises each SDK's 401.
"""

import sys

import anthropic
import google.auth.exceptions
import google.auth.transport.requests
import google.oauth2.credentials
from anthropic import AnthropicVertex
from anthropic.types import Message
from google.genai import Client, errors, types
from google.oauth2 import service_account

PROJECT = "mock-project"
REGION = "us-east5"
CLAUDE_MODEL = "claude-sonnet-4@20250514"
GEMINI_MODEL = "gemini-2.5-flash"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
PROMPT = "Hello from the Vertex SDK check"

checks = []


def check(function):
    checks.append(function)
    return function


def credentials(key_file):
    return service_account.Credentials.from_service_account_file(key_file, scopes=[SCOPE])


def claude(root, key_file, **overrides):
    options = dict(
        region=REGION,
        project_id=PROJECT,
        base_url=f"{root}/v1",
        credentials=credentials(key_file),
        max_retries=0,
    )
    options.update(overrides)
    return AnthropicVertex(**options)


def gemini(root, key_file, api_version=None):
    return Client(
        vertexai=True,
        project=PROJECT,
        location=REGION,
        credentials=credentials(key_file),
        http_options=types.HttpOptions(base_url=root, api_version=api_version),
    )


@check
def the_key_file_gets_a_token(root, key_file):
    creds = credentials(key_file)
    creds.refresh(google.auth.transport.requests.Request())
    assert creds.token.startswith("ya29.mock-"), creds.token
    assert creds.expiry is not None and not creds.expired, creds.expiry


@check
def claude_create(root, key_file):
    message = claude(root, key_file).messages.create(
        model=CLAUDE_MODEL,
        max_tokens=256,
        messages=[{"role": "user", "content": PROMPT}],
    )
    assert isinstance(message, Message), type(message)
    assert message.model == CLAUDE_MODEL, message.model
    assert message.stop_reason == "end_turn", message.stop_reason
    assert message.content[0].type == "text" and message.content[0].text, message.content
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0, message.usage
    return message


@check
def claude_stream_assembles_to_the_create_answer(root, key_file):
    expected = claude_create(root, key_file)
    client = claude(root, key_file)
    with client.messages.stream(
        model=CLAUDE_MODEL,
        max_tokens=256,
        messages=[{"role": "user", "content": PROMPT}],
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == expected.content[0].text, (text, expected.content[0].text)
    assert final.model == CLAUDE_MODEL, final.model
    assert final.stop_reason == "end_turn", final.stop_reason
    assert final.usage.output_tokens == expected.usage.output_tokens, final.usage


@check
def claude_without_a_valid_token_is_refused(root, key_file):
    client = claude(root, key_file, credentials=None, access_token="ya29.not-issued")
    try:
        client.messages.create(
            model=CLAUDE_MODEL, max_tokens=16, messages=[{"role": "user", "content": PROMPT}]
        )
    except anthropic.AuthenticationError as error:
        assert error.status_code == 401, error.status_code
        assert error.body["error"]["status"] == "UNAUTHENTICATED", error.body
    else:
        raise AssertionError("a token the mock did not issue must be refused")


@check
def gemini_generate_and_stream(root, key_file):
    for api_version in (None, "v1"):
        client = gemini(root, key_file, api_version)
        response = client.models.generate_content(model=GEMINI_MODEL, contents=PROMPT)
        assert isinstance(response, types.GenerateContentResponse), type(response)
        assert response.model_version == GEMINI_MODEL, response.model_version
        assert response.text, response
        assert response.candidates[0].finish_reason == types.FinishReason.STOP, response
        assert response.usage_metadata.prompt_token_count > 0, response.usage_metadata

        chunks = list(
            client.models.generate_content_stream(model=GEMINI_MODEL, contents=PROMPT)
        )
        assert len(chunks) > 1, chunks
        assert all(chunk.model_version == GEMINI_MODEL for chunk in chunks), chunks
        # Gemini's answers name their call ("mock gemini answer N to: ..."); the rest is equal.
        streamed = "".join(chunk.text or "" for chunk in chunks)
        assert streamed.split(" to: ")[1:] == response.text.split(" to: ")[1:], streamed
        assert PROMPT in streamed, streamed
        assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP, chunks[-1]


@check
def gemini_without_a_valid_token_is_refused(root, key_file):
    # A token the mock never issued, carried by a credential that has nothing to refresh.
    unissued = google.oauth2.credentials.Credentials(token="ya29.not-issued")
    client = Client(
        vertexai=True,
        project=PROJECT,
        location=REGION,
        credentials=unissued,
        http_options=types.HttpOptions(base_url=root),
    )
    try:
        client.models.generate_content(model=GEMINI_MODEL, contents=PROMPT)
    except errors.ClientError as error:
        assert error.code == 401 and error.status == "UNAUTHENTICATED", (error.code, error.status)
    else:
        raise AssertionError("a token the mock did not issue must be refused")


@check
def a_token_without_the_cloud_platform_scope_is_not_issued(root, key_file):
    creds = service_account.Credentials.from_service_account_file(
        key_file, scopes=["https://www.googleapis.com/auth/userinfo.email"]
    )
    try:
        creds.refresh(google.auth.transport.requests.Request())
    except google.auth.exceptions.RefreshError as error:
        assert "invalid_scope" in str(error), error
    else:
        raise AssertionError("the token endpoint must refuse an assertion without the scope")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    root = sys.argv[1].rstrip("/").removesuffix("/v1")
    key_file = sys.argv[2]
    for function in checks:
        function(root, key_file)
        print(f"ok {function.__name__}")
    print(f"{len(checks)} passed, 0 failed")


if __name__ == "__main__":
    main()
