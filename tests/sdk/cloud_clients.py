"""Drives corral as apps written for Claude on the clouds do: the `anthropic`
SDK's `AnthropicBedrock` and `AnthropicVertex` clients and boto3's
`bedrock-runtime`, pointed at corral; run by tests/it/clouds_inbound.rs.

Usage: python3 cloud_clients.py BASE_URL MODE KEY [N [PROMPT]]
  BASE_URL  corral's `/v1` URL (the clients are given its root, or its `/v1`
            for Vertex, as their base URL)
  MODE      `bedrock_sdk`: AnthropicBedrock messages.create and messages.stream,
                           the gateway key as its Bedrock API key;
            `boto3`:       invoke_model and invoke_model_with_response_stream,
                           SigV4-signed, the gateway key as `x-api-key`;
            `boto3_herd`, `bedrock_sdk_herd`, `vertex_sdk_herd`: N identical
                           calls at once from one client;
            `vertex_sdk`:  AnthropicVertex messages.create and messages.stream,
                           the gateway key as its access token;
            `sigv4_only`:  AnthropicBedrock signing with AWS keys and nothing
                           else: prints the status corral answered.
  KEY       the gateway key

Prints one JSON line of what the SDKs parsed.
"""

import base64
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

BEDROCK_ID = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
VERTEX_ID = "claude-sonnet-4-5@20250929"
MESSAGES = [{"role": "user", "content": "Say hello to the cloud test."}]
HERD_MESSAGES = [{"role": "user", "content": "Say hello to the cloud herd."}]


def sdk_calls(client, model):
    import anthropic

    answer = client.messages.create(model=model, max_tokens=64, messages=MESSAGES)
    assert isinstance(answer, anthropic.types.Message), type(answer)
    with client.messages.stream(
        model=model, max_tokens=64, messages=[{"role": "user", "content": "Stream to the cloud test."}]
    ) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()
    return {
        "text": answer.content[0].text,
        "model": answer.model,
        "stream_events": events,
        "stream_text": final.content[0].text,
    }


def boto3_client(root, key):
    """boto3 as an AWS app has it: SigV4 with its own (here: made-up) keys,
    which corral cannot check, plus the gateway key as `x-api-key`, added to
    every request (boto3 takes a bearer token over HTTPS only)."""
    import boto3
    import botocore.config

    client = boto3.client(
        "bedrock-runtime",
        endpoint_url=root,
        region_name="us-east-1",
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        config=botocore.config.Config(retries={"max_attempts": 1}, max_pool_connections=64),
    )

    def add_key(request, **_):
        request.headers["x-api-key"] = key

    client.meta.events.register("before-sign.bedrock-runtime.*", add_key)
    return client


def invoke(client, messages):
    body = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 64, "temperature": 0, "messages": messages}
    answer = client.invoke_model(modelId=BEDROCK_ID, body=json.dumps(body))
    message = json.loads(answer["body"].read())
    return message["content"][0]["text"]


def main() -> int:
    base_url, mode, key = sys.argv[1], sys.argv[2], sys.argv[3]
    root = base_url.removesuffix("/v1")
    results = {}
    if mode == "bedrock_sdk":
        from anthropic import AnthropicBedrock

        client = AnthropicBedrock(base_url=root, api_key=key, aws_region="us-east-1", max_retries=0)
        results = sdk_calls(client, BEDROCK_ID)
    elif mode == "vertex_sdk":
        from anthropic import AnthropicVertex

        client = AnthropicVertex(
            base_url=f"{root}/v1", region="us-east5", project_id="corral-test", access_token=key, max_retries=0
        )
        results = sdk_calls(client, VERTEX_ID)
    elif mode == "boto3":
        client = boto3_client(root, key)
        results["text"] = invoke(client, MESSAGES)
        body = {
            "anthropic_version": "bedrock-2023-05-31",
            "max_tokens": 64,
            "temperature": 0,
            "messages": [{"role": "user", "content": "Stream to boto3."}],
        }
        answer = client.invoke_model_with_response_stream(modelId=BEDROCK_ID, body=json.dumps(body))
        events, text = [], ""
        for part in answer["body"]:
            event = json.loads(base64.b64decode(part["chunk"]["bytes"]) if isinstance(part["chunk"]["bytes"], str) else part["chunk"]["bytes"])
            events.append(event["type"])
            if event["type"] == "content_block_delta":
                text += event["delta"].get("text", "")
        results["stream_events"] = events
        results["stream_text"] = text
    elif mode in ("boto3_herd", "bedrock_sdk_herd", "vertex_sdk_herd"):
        n = int(sys.argv[4])
        herd = [{"role": "user", "content": sys.argv[5]}] if len(sys.argv) > 5 else HERD_MESSAGES
        if mode == "boto3_herd":
            client = boto3_client(root, key)
            call = lambda _: invoke(client, herd)  # noqa: E731
        else:
            from anthropic import AnthropicBedrock, AnthropicVertex

            if mode == "bedrock_sdk_herd":
                client = AnthropicBedrock(base_url=root, api_key=key, aws_region="us-east-1", max_retries=0)
                model = BEDROCK_ID
            else:
                client = AnthropicVertex(
                    base_url=f"{root}/v1", region="us-east5", project_id="corral-test", access_token=key, max_retries=0
                )
                model = VERTEX_ID
            call = lambda _: client.messages.create(  # noqa: E731
                model=model, max_tokens=64, messages=herd
            ).content[0].text
        with ThreadPoolExecutor(max_workers=n) as pool:
            results["herd"] = list(pool.map(call, range(n)))
    elif mode == "sigv4_only":
        import anthropic
        from anthropic import AnthropicBedrock

        client = AnthropicBedrock(
            base_url=root,
            aws_access_key="AKIDEXAMPLE",
            aws_secret_key="wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            aws_region="us-east-1",
            max_retries=0,
        )
        try:
            client.messages.create(model=BEDROCK_ID, max_tokens=16, messages=MESSAGES)
            results["status"] = 200
        except anthropic.APIStatusError as error:
            results["status"] = error.status_code
            results["error_type"] = error.response.headers.get("x-amzn-errortype")
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
