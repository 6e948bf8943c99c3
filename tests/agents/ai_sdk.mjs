// The Vercel AI SDK (`ai` with `@ai-sdk/anthropic` and `@ai-sdk/openai`) against corral, one
// phase per run: `node ai_sdk.mjs <corral URL> <phase>` prints one JSON line.
//
// - anthropic-tools: `streamText` and `generateText` of one prompt offering a tool, at once.
//   The Anthropic provider adds `eager_input_streaming: true` to each tool of a streaming
//   request only, so the two bodies differ in that and in `stream`.
// - openai-429: one `generateText` (default maxRetries, 2) against a provider that answers
//   every call 429 with Retry-After; reports what the SDK raised.
// - openai-plain: `generateText`, then `streamText` of the same prompt.
import { APICallError, RetryError, generateText, jsonSchema, streamText, tool } from "ai";
import { createAnthropic } from "@ai-sdk/anthropic";
import { createOpenAI } from "@ai-sdk/openai";

const [base, phase] = process.argv.slice(2);

const weather = tool({
  description: "The weather in a city.",
  inputSchema: jsonSchema({
    type: "object",
    properties: { city: { type: "string" } },
    required: ["city"],
    additionalProperties: false,
  }),
});

async function anthropicTools() {
  const anthropic = createAnthropic({ baseURL: `${base}/v1`, apiKey: "sk-ant-ai-sdk" });
  const request = {
    model: anthropic("claude-sonnet-4-5"),
    prompt: "What is the weather in Paris?",
    tools: { weather },
  };
  let streamError = null;
  const streamed = streamText({ ...request, onError: ({ error }) => { streamError = String(error); } });
  const [generated, streamedText] = await Promise.all([generateText(request), streamed.text]);
  return {
    generate: generated.text,
    stream: streamedText,
    stream_error: streamError,
    finish: [generated.finishReason, await streamed.finishReason],
  };
}

async function openai429() {
  const openai = createOpenAI({ baseURL: `${base}/v1`, apiKey: "sk-ai-sdk" });
  try {
    const result = await generateText({ model: openai("gpt-4o-mini"), prompt: "Are you busy?" });
    return { answered: result.text };
  } catch (error) {
    const last = error.lastError ?? error;
    return {
      error: error.name,
      retry_error: RetryError.isInstance(error),
      reason: error.reason ?? null,
      attempts: (error.errors ?? [error]).map((attempt) => ({
        api_call_error: APICallError.isInstance(attempt),
        status: attempt.statusCode ?? null,
        retryable: attempt.isRetryable ?? null,
      })),
      last_status: last.statusCode ?? null,
      message: String(error.message),
    };
  }
}

async function openaiPlain() {
  const openai = createOpenAI({ baseURL: `${base}/v1`, apiKey: "sk-ai-sdk" });
  const request = { model: openai("gpt-4o-mini"), prompt: "Say hello.", temperature: 0 };
  const generated = await generateText(request);
  const streamed = streamText(request);
  return { generate: generated.text, stream: await streamed.text };
}

const phases = { "anthropic-tools": anthropicTools, "openai-429": openai429, "openai-plain": openaiPlain };
if (!phases[phase]) {
  throw new Error(`unknown phase ${phase}; one of ${Object.keys(phases)}`);
}
console.log(JSON.stringify(await phases[phase]()));
