"""Check the mock's Bedrock surface against the official SDKs' own parsing and signing.

Usage: python3 bedrock_sdk_check.py http://127.0.0.1:PORT

PORT is a running mock-upstream (its ready line names the address; a trailing `/v1` is
ignored) started with its default Bedrock settings, or with the ones named by the environment:
MOCK_AWS_ACCESS_KEY_ID, MOCK_AWS_SECRET_ACCESS_KEY, MOCK_AWS_REGION, MOCK_BEDROCK_API_KEY
(defaults: the mock's test credentials, us-east-1, the mock's test API key). Exits non-zero with
a traceback on the first mismatch, and prints "N passed, 0 failed" when every check passed.
Requirements: bedrock_sdk_requirements.txt beside this file.

What it proves: boto3's `bedrock-runtime` client signs requests the mock verifies (SigV4 over
the exact body) and parses `invoke_model` and `invoke_model_with_response_stream` answers
(event-stream frames, CRCs included, whose chunk bytes decode to Messages events), raises
`EventStreamError` for the mid-stream `throttlingException` and `ClientError` with Bedrock's
error codes; Anthropic's `AnthropicBedrock` client (SigV4 and API key) parses `messages.create`
and `messages.stream` into its own types. The mock's own counter confirms the signatures were
checked, not just present.
"""

import json
import os
import sys
import urllib.request

import anthropic
import boto3
import botocore.exceptions
from anthropic import AnthropicBedrock
from anthropic.types import Message
from botocore.config import Config

ACCESS_KEY_ID = os.environ.get("MOCK_AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
SECRET_ACCESS_KEY = os.environ.get(
    "MOCK_AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
)
REGION = os.environ.get("MOCK_AWS_REGION", "us-east-1")
API_KEY = os.environ.get(
    "MOCK_BEDROCK_API_KEY", "ABSKbW9jay11cHN0cmVhbTp0ZXN0LWJlZHJvY2sta2V5"
)
MODEL_ID = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
SYSTEM = "You are terse."
PROMPT = "Hello from the Bedrock SDK check"
MAX_TOKENS = 256
THROTTLE_TRIGGER = "[[bedrock_throttle_midstream]]"
NOT_READY_TRIGGER = "[[bedrock_model_not_ready]]"
# One attempt: a retry would hide which answer the SDK got, and the mock answers at once.
NO_RETRIES = Config(retries={"total_max_attempts": 1}, read_timeout=20, connect_timeout=5)

checks = []


def check(function):
    checks.append(function)
    return function


def body(prompt=PROMPT, **extra):
    return json.dumps(
        {
            "anthropic_version": "bedrock-2023-05-31",
            "max_tokens": MAX_TOKENS,
            "system": SYSTEM,
            "messages": [{"role": "user", "content": prompt}],
            **extra,
        }
    )


def boto_client(root, access_key=ACCESS_KEY_ID, secret_key=SECRET_ACCESS_KEY):
    return boto3.client(
        "bedrock-runtime",
        endpoint_url=root,
        region_name=REGION,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        config=NO_RETRIES,
    )


def anthropic_client(root, **credentials):
    if not credentials:
        credentials = {"aws_access_key": ACCESS_KEY_ID, "aws_secret_key": SECRET_ACCESS_KEY}
    return AnthropicBedrock(base_url=root, aws_region=REGION, max_retries=0, timeout=20, **credentials)


def door(root):
    with urllib.request.urlopen(f"{root}/__mock/bedrock", timeout=10) as answer:
        return json.load(answer)


def client_error(call):
    """The `ClientError` a call raises: (code, HTTP status, message)."""
    try:
        call()
    except botocore.exceptions.ClientError as error:
        return (
            error.response["Error"]["Code"],
            error.response["ResponseMetadata"]["HTTPStatusCode"],
            error.response["Error"]["Message"],
        )
    raise AssertionError("the call must fail")


def stream_events(response):
    """The Messages events a boto3 response stream carried, decoded from the chunks' bytes."""
    events = []
    for event in response["body"]:
        assert set(event) == {"chunk"}, event
        # botocore already base64-decoded the `bytes` blob of the chunk's JSON payload.
        events.append(json.loads(event["chunk"]["bytes"]))
    return events


def text_of(events):
    return "".join(
        e["delta"]["text"] for e in events if e["type"] == "content_block_delta"
    )


expected_text = None


@check
def boto3_invoke_model(root):
    global expected_text
    verified = door(root)["sigv4_verified"]
    response = boto_client(root).invoke_model(
        modelId=MODEL_ID, body=body(), contentType="application/json", accept="application/json"
    )
    assert response["contentType"].startswith("application/json"), response["contentType"]
    message = json.loads(response["body"].read())
    assert message["type"] == "message" and message["role"] == "assistant", message
    assert message["model"] == MODEL_ID, message["model"]
    assert message["stop_reason"] == "end_turn", message
    assert message["usage"]["input_tokens"] > 0 and message["usage"]["output_tokens"] > 0, message
    expected_text = message["content"][0]["text"]
    assert expected_text, message
    assert door(root)["sigv4_verified"] == verified + 1, "the mock verified boto3's signature"


@check
def boto3_invoke_model_with_response_stream(root):
    response = boto_client(root).invoke_model_with_response_stream(
        modelId=MODEL_ID, body=body(), contentType="application/json"
    )
    # The content type of the chunks (`x-amzn-bedrock-content-type`), not of the frames.
    assert response["contentType"] == "application/json", response["contentType"]
    headers = response["ResponseMetadata"]["HTTPHeaders"]
    assert headers["content-type"] == "application/vnd.amazon.eventstream", headers
    events = stream_events(response)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    assert "content_block_delta" in kinds and "message_delta" in kinds, kinds
    assert events[0]["message"]["model"] == MODEL_ID, events[0]
    assert text_of(events) == expected_text, (text_of(events), expected_text)
    metrics = events[-1]["amazon-bedrock-invocationMetrics"]
    assert metrics["inputTokenCount"] > 0 and metrics["outputTokenCount"] > 0, metrics


@check
def boto3_raises_the_midstream_throttling_exception(root):
    response = boto_client(root).invoke_model_with_response_stream(
        modelId=MODEL_ID, body=body(f"{PROMPT} {THROTTLE_TRIGGER}")
    )
    received = []
    try:
        for event in response["body"]:
            received.append(json.loads(event["chunk"]["bytes"]))
    except botocore.exceptions.EventStreamError as error:
        assert error.response["Error"]["Code"] == "throttlingException", error.response
        assert "Too many requests" in error.response["Error"]["Message"], error.response
    else:
        raise AssertionError("the stream must end in a throttlingException")
    assert received and received[0]["type"] == "message_start", received
    assert received[-1]["type"] == "content_block_delta", received


@check
def boto3_reads_bedrocks_errors(root):
    client = boto_client(root)
    code, status, _ = client_error(
        lambda: client.invoke_model(modelId=MODEL_ID, body=body(f"{PROMPT} {NOT_READY_TRIGGER}"))
    )
    assert (code, status) == ("ModelNotReadyException", 429), (code, status)
    code, status, message = client_error(
        lambda: client.invoke_model(modelId=MODEL_ID, body=body(model="claude"))
    )
    assert (code, status) == ("ValidationException", 400), (code, status)
    assert "extraneous key [model] is not permitted" in message, message


@check
def boto3_with_wrong_credentials_is_refused(root):
    refused = door(root)["refused"]
    wrong_secret = boto_client(root, secret_key="not-the-secret")
    code, status, message = client_error(
        lambda: wrong_secret.invoke_model(modelId=MODEL_ID, body=body())
    )
    assert (code, status) == ("InvalidSignatureException", 403), (code, status)
    assert message.startswith("The request signature we calculated does not match"), message
    unknown_key = boto_client(root, access_key="AKIAUNKNOWNKEY000000")
    code, status, _ = client_error(lambda: unknown_key.invoke_model(modelId=MODEL_ID, body=body()))
    assert (code, status) == ("UnrecognizedClientException", 403), (code, status)
    assert door(root)["refused"] == refused + 2


@check
def anthropic_bedrock_messages_create(root):
    verified = door(root)["sigv4_verified"]
    message = anthropic_client(root).messages.create(
        model=MODEL_ID,
        max_tokens=MAX_TOKENS,
        system=SYSTEM,
        messages=[{"role": "user", "content": PROMPT}],
    )
    assert isinstance(message, Message), type(message)
    assert message.model == MODEL_ID, message.model
    assert message.content[0].text == expected_text, (message.content[0].text, expected_text)
    assert message.usage.input_tokens > 0, message.usage
    assert door(root)["sigv4_verified"] == verified + 1, "the mock verified the SDK's signature"


@check
def anthropic_bedrock_messages_stream(root):
    with anthropic_client(root).messages.stream(
        model=MODEL_ID,
        max_tokens=MAX_TOKENS,
        system=SYSTEM,
        messages=[{"role": "user", "content": PROMPT}],
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == expected_text, (text, expected_text)
    assert isinstance(final, Message) and final.stop_reason == "end_turn", final
    assert final.usage.output_tokens > 0, final.usage


@check
def anthropic_bedrock_with_an_api_key(root):
    verified = door(root)["sigv4_verified"]
    message = anthropic_client(root, api_key=API_KEY).messages.create(
        model=MODEL_ID,
        max_tokens=MAX_TOKENS,
        system=SYSTEM,
        messages=[{"role": "user", "content": PROMPT}],
    )
    assert message.content[0].text == expected_text, message
    assert door(root)["sigv4_verified"] == verified, "a bearer key is no signature"
    try:
        anthropic_client(root, api_key="ABSKnot-a-key").messages.create(
            model=MODEL_ID, max_tokens=8, messages=[{"role": "user", "content": PROMPT}]
        )
    except anthropic.PermissionDeniedError as error:
        assert error.status_code == 403, error.status_code
    else:
        raise AssertionError("an unknown API key must be refused")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = sys.argv[1].rstrip("/").removesuffix("/v1")
    # Loopback calls must not go through a proxy from the environment.
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"
    for function in checks:
        function(root)
        print(f"ok {function.__name__}")
    print(f"{len(checks)} passed, 0 failed")


if __name__ == "__main__":
    main()
