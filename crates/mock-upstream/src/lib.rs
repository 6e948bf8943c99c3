//! The mock provider (OpenAI, Anthropic, Gemini, Azure OpenAI, Amazon Bedrock and Vertex AI): a real HTTP server that
//! stands in for the paid providers in the integration tests, the demos and the load tests.
//!
//! It owns three things. The OpenAI surface (`/v1/chat/completions`, `/v1/completions`,
//! `/v1/embeddings`, `/v1/audio/transcriptions`, `/v1/images/generations`, `/v1/models`, and `/v1/responses` in
//! `responses.rs`) and the Anthropic one
//! (`/v1/messages`, `/v1/messages/count_tokens`), and Gemini's native one
//! (`/v1beta/models/{model}:generateContent`, `:streamGenerateContent`, `:countTokens`,
//! `:embedContent`, `:batchEmbedContents`, the same under `/v1/`, and `/v1beta/models`),
//! answered deterministically from the request
//! body so that identical requests get identical content and different requests differ
//! (`openai.rs`, `anthropic.rs`, `gemini.rs`). The
//! ledger of billable calls: every call is counted and recorded on arrival, before anything can
//! delay it, so a test can assert "the gateway sent exactly one upstream request" and can wait
//! for that event instead of sleeping ([`MockProvider::wait_for_calls`]). And the knobs a test
//! turns to provoke the gateway: hold every call until released, inject failures, answer from a
//! FIFO of scripted responses, add latency, cut streams short, pad streams to a size and keep
//! them open before their final event (`delivery.rs`), or before their first
//! (`stream_starts.rs`). The same knobs are exposed over
//! HTTP under `/__mock/*` for the `mock-upstream` binary (`http.rs`, `admin.rs`).
//!
//! Azure OpenAI (`azure.rs`) answers the OpenAI content by Azure's paths, billed and steered
//! like the OpenAI calls: the v1 shape, `/openai/v1/{chat/completions, completions, embeddings,
//! responses}` with the deployment as the body's `model`, and the versioned shape,
//! `/openai/deployments/{deployment}/{chat/completions, completions, embeddings}` and
//! `/openai/responses`, each with `?api-version=` (without it: Azure's 404). Answers name the
//! snapshot [`AZURE_CHAT_MODEL`] (embeddings: [`AZURE_EMBEDDING_MODEL`]) and carry Azure's
//! content-filter annotations; a streamed chat opens with a choice-less prompt-annotation chunk
//! and follows each finish with a delta-less annotation chunk. [`CONTENT_FILTER_400_TRIGGER`]
//! and [`CONTENT_FILTER_FINISH_TRIGGER`] in a user message provoke the filter's two verdicts;
//! injected failures there take Azure's error shape and rate-limit headers. Unlike the other
//! surfaces, Azure's authenticates: `api-key` with an accepted key
//! ([`MockProvider::set_azure_keys`]; any non-empty key when none is set) or `Authorization:
//! Bearer` with an unexpired token from the mock's Entra endpoint, `POST
//! /{tenant}/oauth2/v2.0/token` (`entra.rs`: client credentials checked against
//! [`MockProvider::set_entra_client`], lifetimes queued by
//! [`MockProvider::push_token_lifetime`], requests counted by
//! [`MockProvider::token_requests`], apart from the calls). Requests the door refuses are no
//! calls; [`MockProvider::azure_refused`] keeps them.
//!
//! Vertex AI (`vertex.rs`) answers Claude and Gemini by Vertex's paths, `POST
//! /v1/projects/{project}/locations/{location}/publishers/{publisher}/models/{model}:{method}`
//! (also under `/v1beta1/`): publisher `anthropic` with `rawPredict` (a Messages answer) and
//! `streamRawPredict` (Anthropic's SSE), the body a Messages body without `model` and with
//! `"anthropic_version": "vertex-2023-10-16"` (one of [`VERTEX_ANTHROPIC_VERSIONS`]); publisher `google`
//! with `generateContent`, `streamGenerateContent` and `countTokens`, as the Gemini surface
//! answers them. The answers name the path's model; they are billed and steered like any call,
//! injected failures in Google's shape. Every Vertex path wants `Authorization: Bearer` with an
//! unexpired token from the mock's Google token endpoint, `POST /token` (`google_token.rs`: the
//! JWT-bearer grant, its assertion signed by the test service account whose key file
//! [`MockProvider::service_account_json`] returns, made once per process; lifetimes queued by
//! [`MockProvider::push_google_token_lifetime`], requests counted by
//! [`MockProvider::google_token_requests`]). Requests refused there are no calls.
//! Amazon Bedrock Runtime (`bedrock.rs`) answers Anthropic models by Bedrock's paths, `POST
//! /model/{modelId}/invoke` (JSON) and `POST /model/{modelId}/invoke-with-response-stream` (AWS
//! event-stream frames, each a `chunk` wrapping one Messages event), the model id
//! percent-encoded in the path, with the Messages content of the Anthropic surface. Bodies are
//! Bedrock's: `anthropic_version` one of [`BEDROCK_ANTHROPIC_VERSIONS`], no `model`, no `stream`
//! (else a 400 `ValidationException`). It authenticates as AWS does: a SigV4 signature (service
//! `bedrock`, [`BedrockSettings::region`]) checked over the exact body with the mock's
//! [`AwsCredentials`] (`sigv4_check.rs`, signatures counted by [`MockProvider::sigv4_verified`]),
//! or `Authorization: Bearer` with an accepted API key ([`MockProvider::set_bedrock_api_keys`]);
//! others get AWS's 403 and are kept by [`MockProvider::bedrock_refused`], not billed. Errors are
//! `{"message"}` with `x-amzn-ErrorType`; [`BEDROCK_MODEL_NOT_READY_TRIGGER`] and
//! [`BEDROCK_THROTTLE_MIDSTREAM_TRIGGER`] in a user message provoke a 429
//! `ModelNotReadyException` and a `throttlingException` frame mid-stream.
//!
//! Elsewhere it deliberately does not model tokenizers, rate limits or authentication: the
//! gateway forwards those untouched, so the mock only has to make them observable. Tool calls are
//! modelled only where an agent needs one to take a step: a Responses request that forces a
//! tool (`tool_choice`) is answered with a `function_call` (`responses.rs`).

mod admin;
mod anthropic;
mod azure;
mod bedrock;
mod delivery;
mod entra;
mod gemini;
mod google_token;
mod http;
mod openai;
mod responses;
mod sigv4_check;
mod stream_starts;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;
mod vertex;

pub use azure::{
    AZURE_CHAT_MODEL, AZURE_EMBEDDING_MODEL, CONTENT_FILTER_400_TRIGGER,
    CONTENT_FILTER_FINISH_TRIGGER,
};
pub use bedrock::{
    AwsCredentials, BEDROCK_ANTHROPIC_VERSION, BEDROCK_ANTHROPIC_VERSIONS, BEDROCK_DEFAULT_REGION,
    BEDROCK_MODEL_NOT_READY_TRIGGER, BEDROCK_TEST_ACCESS_KEY_ID, BEDROCK_TEST_API_KEY,
    BEDROCK_TEST_SECRET_ACCESS_KEY, BEDROCK_THROTTLE_MIDSTREAM_TRIGGER, BedrockSettings,
};
pub use delivery::StreamsAtEnd;
pub use entra::EntraClient;
pub use google_token::{
    CLOUD_PLATFORM_SCOPE, SERVICE_ACCOUNT_EMAIL, SERVICE_ACCOUNT_PROJECT, service_account_json,
};
pub use vertex::{VERTEX_ANTHROPIC_VERSION, VERTEX_ANTHROPIC_VERSIONS};

use std::collections::{BTreeMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};

/// How long `serve` keeps waiting for open connections after its shutdown signal fired.
///
/// Graceful shutdown waits for every in-flight response, and a client that keeps reading a slow
/// stream would otherwise keep a stopped mock alive; a test that dropped its provider wants the
/// port gone, not a best effort.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Startup configuration of a mock provider; [`MockProvider::reset`] returns to it.
#[derive(Debug, Clone, Default)]
pub struct MockSettings {
    /// Added to every billable call after any hold and before the answer, failures included.
    pub latency: Duration,
    /// Pause between two SSE events of a streamed answer; zero sends the stream in one go.
    pub stream_chunk_delay: Duration,
    /// Silence between a streamed answer's response head and its first event: a reasoning
    /// model thinking before it says anything.
    pub stream_first_event_delay: Duration,
    /// Failure injection active from the start, as if [`MockProvider::set_failure`] were called.
    pub failure: Option<FailureMode>,
    /// The model ids `/v1/models` lists; `None` lists the default three (`gpt-4o-mini`,
    /// `gpt-4o`, `text-embedding-3-small`). A gateway with two mocks tells them apart by these.
    pub models: Option<Vec<String>>,
    /// The keys Azure routes accept in `api-key`; empty accepts any non-empty key.
    pub azure_keys: Vec<String>,
    /// The app registration Entra's token endpoint knows; `None` issues a token to any client
    /// that sends a non-empty secret.
    pub entra_client: Option<EntraClient>,
    /// Bedrock's door: the AWS credentials and region signatures are checked against, and the
    /// accepted API keys.
    pub bedrock: BedrockSettings,
}

/// Make a share of the billable calls fail with an error in the shape of the endpoint's API
/// (OpenAI's, Anthropic's on `/v1/messages*`, where 529 is `overloaded_error`, or Gemini's
/// `{"error":{"code","message","status"}}` on its methods, where 429 is `RESOURCE_EXHAUSTED`).
#[derive(Debug, Clone, PartialEq)]
pub struct FailureMode {
    /// HTTP status of the failed call; an invalid status is answered as 500.
    pub status: u16,
    /// Probability in `[0, 1]` that a given call fails; 1.0 makes every call fail, 0.0 none.
    pub fraction: f64,
    /// Sent as `Retry-After` (whole seconds, rounded up) and `retry-after-ms`; Gemini's
    /// failures send `Retry-After` and, as Google does, a `RetryInfo` detail (`retryDelay`).
    pub retry_after: Option<Duration>,
    /// Sent as `error.code`, e.g. `"insufficient_quota"`; on Gemini's surface (whose
    /// `error.code` is the HTTP status) as `error.status` instead, e.g. `"FAILED_PRECONDITION"`.
    pub code: Option<String>,
}

impl FailureMode {
    /// Every call fails with `status`, without `Retry-After` or code.
    pub fn always(status: u16) -> Self {
        Self {
            status,
            fraction: 1.0,
            retry_after: None,
            code: None,
        }
    }

    /// The same failure, announcing when the client may retry.
    pub fn with_retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = Some(retry_after);
        self
    }

    /// The same failure, with `error.code` set.
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }
}

/// One canned response, sent verbatim instead of the computed answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scripted {
    /// HTTP status; an invalid status is answered as 500.
    pub status: u16,
    /// Extra headers; `content-type` defaults to `application/json` unless given here.
    pub headers: Vec<(String, String)>,
    /// The body, byte for byte (an SSE body with an event-stream content type works too).
    pub body: String,
}

impl Scripted {
    /// A JSON response with the given status and body.
    pub fn json(status: u16, body: impl Into<String>) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }
}

/// A billable request exactly as it reached the mock.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// Request path, e.g. `/v1/chat/completions`.
    pub path: String,
    /// Raw query string, without the `?`.
    pub query: Option<String>,
    /// Headers in arrival order, names lower-case, values decoded lossily as UTF-8.
    pub headers: Vec<(String, String)>,
    /// The raw body.
    pub body: Bytes,
    /// When the request arrived (after its body was read, before any hold or latency).
    pub at: Instant,
}

impl RecordedRequest {
    /// The first value of header `name` (case-insensitive), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Which credential headers the request carried, of `authorization`, `x-api-key` and
    /// `api-key` (Azure's), in that order: how a test sees that a gateway sent the provider's
    /// key the way it expects.
    pub fn auth_headers(&self) -> Vec<&'static str> {
        ["authorization", "x-api-key", "api-key"]
            .into_iter()
            .filter(|name| self.header(name).is_some())
            .collect()
    }

    /// The body parsed as JSON, if it is JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

/// Handle to a running mock provider started by [`MockProvider::start`].
///
/// Clones share the same server; the server stops when the last clone is dropped.
#[derive(Clone)]
pub struct MockProvider {
    inner: Arc<Handle>,
}

struct Handle {
    shared: Arc<Shared>,
    addr: SocketAddr,
    /// Cancels the server task when the last handle goes away, so a test never leaks a server.
    _stop: DropGuard,
}

impl MockProvider {
    /// Bind `127.0.0.1:0` and serve in a spawned task until the last handle is dropped.
    ///
    /// The listener is bound before this returns, so requests sent right away are queued by the
    /// kernel rather than refused.
    pub async fn start(settings: MockSettings) -> anyhow::Result<MockProvider> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .context("mock provider: binding 127.0.0.1:0")?;
        let addr = listener
            .local_addr()
            .context("mock provider: reading the bound address")?;
        let shared = Arc::new(Shared::new(settings));
        let stop = CancellationToken::new();
        let server_shared = Arc::clone(&shared);
        let signal = stop.clone().cancelled_owned();
        tokio::spawn(async move {
            if let Err(error) = run(listener, server_shared, signal).await {
                tracing::error!(error = format!("{error:#}"), "mock provider stopped");
            }
        });
        Ok(MockProvider {
            inner: Arc::new(Handle {
                shared,
                addr,
                _stop: stop.drop_guard(),
            }),
        })
    }

    /// Serve a mock provider on `listener` until `shutdown` completes; used by `mock-upstream`.
    ///
    /// On shutdown, held requests and long polls are let go and open connections get
    /// a few seconds to finish before this returns anyway.
    pub async fn serve(
        listener: TcpListener,
        settings: MockSettings,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        run(listener, Arc::new(Shared::new(settings)), shutdown).await
    }

    /// The base URL of this mock, `http://127.0.0.1:PORT/v1` (for OpenAI and Anthropic clients alike).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.inner.addr)
    }

    /// The socket address the mock listens on.
    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// The origin of this mock, `http://127.0.0.1:PORT`, below which every
    /// provider's surface it speaks is rooted (Azure's `/openai`, Vertex's
    /// `/v1/projects/...`, the token endpoints).
    pub fn origin(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    /// The Azure OpenAI endpoint of this mock, its origin (what
    /// `AzureOpenAI(azure_endpoint=...)` takes; the v1 base URL is this plus `/openai/v1`).
    pub fn azure_endpoint(&self) -> String {
        self.origin()
    }

    /// The Entra token URL of `tenant` on this mock, in place of
    /// `https://login.microsoftonline.com/{tenant}/oauth2/v2.0/token`.
    pub fn entra_token_url(&self, tenant: &str) -> String {
        format!("http://{}/{tenant}/oauth2/v2.0/token", self.inner.addr)
    }

    /// From now on, Azure routes accept exactly these keys in `api-key`; an empty list accepts
    /// any non-empty key.
    pub fn set_azure_keys(&self, keys: Vec<String>) {
        self.inner.shared.azure.set_keys(keys);
    }

    /// From now on, Entra's token endpoint issues tokens only to this client and secret.
    pub fn set_entra_client(&self, client_id: impl Into<String>, client_secret: impl Into<String>) {
        self.inner
            .shared
            .entra
            .set_client(Some(EntraClient::new(client_id, client_secret)));
    }

    /// Queue the lifetime of the next token issued (FIFO); tokens beyond the queue live an
    /// hour. `expires_in` reports it in whole seconds, rounded down; the token is refused from
    /// the exact instant it expires, by tokio's clock (so a paused test clock ages it).
    pub fn push_token_lifetime(&self, lifetime: Duration) {
        self.inner.shared.entra.push_lifetime(lifetime);
    }

    /// Replace the queue of token lifetimes, e.g. `[1s]`: the first token lives a second, the
    /// next ones an hour.
    pub fn set_token_lifetimes(&self, lifetimes: Vec<Duration>) {
        self.inner.shared.entra.set_lifetimes(lifetimes);
    }

    /// Requests to Entra's token endpoint so far, refused ones included. Not billable calls:
    /// they are not in [`calls`](Self::calls).
    pub fn token_requests(&self) -> u64 {
        self.inner.shared.entra.requests()
    }

    /// Wait until `token_requests() >= n`; false if `timeout` passed first. Woken by each
    /// arrival, like [`wait_for_calls`](Self::wait_for_calls).
    pub async fn wait_for_token_requests(&self, n: u64, timeout: Duration) -> bool {
        let shared = &self.inner.shared;
        shared
            .entra
            .wait_for_requests(n, timeout, &shared.stopping)
            .await
    }

    /// Azure requests turned away at the door since start or the last reset (401 for a
    /// missing, wrong or expired credential, 404 for a missing `api-version`), in arrival
    /// order, bodies included. They are not calls: nothing was billed, held or scripted.
    pub fn azure_refused(&self) -> Vec<RecordedRequest> {
        self.inner.shared.azure.refused()
    }

    /// Billable calls received so far (chat completions, completions, embeddings, messages,
    /// token counts, transcriptions, image generations, Gemini's `models/{model}:{method}`
    /// calls, Azure's and Bedrock's operations once past their doors; not Entra's token
    /// requests), counted on
    /// arrival, before any hold or latency, whatever the answer turns out to be.
    pub fn calls(&self) -> u64 {
        self.inner.shared.calls()
    }

    /// Billable calls whose path ends with `path_suffix`, e.g. `"/chat/completions"`.
    ///
    /// This is a suffix match: `"/completions"` counts chat completions too.
    pub fn calls_to(&self, path_suffix: &str) -> u64 {
        self.inner.shared.calls_to(path_suffix)
    }

    /// Wait until `calls() >= n`; false if `timeout` passed first.
    ///
    /// Woken by each arrival rather than by polling, so it returns as soon as the call lands.
    pub async fn wait_for_calls(&self, n: u64, timeout: Duration) -> bool {
        self.inner.shared.wait_for_calls(n, timeout).await
    }

    /// From now on, billable calls are counted and then block until [`release`](Self::release).
    ///
    /// Held calls have no deadline of their own: the test decides when they go on.
    pub fn hold(&self) {
        self.inner.shared.set_hold(true);
    }

    /// Wake every held call at once and stop holding.
    pub fn release(&self) {
        self.inner.shared.set_hold(false);
    }

    /// Queue a canned response: the next billable call that arrives answers with it (FIFO),
    /// before failure injection and whatever its body says.
    pub fn push_script(&self, script: Scripted) {
        self.inner.shared.push_script(script);
    }

    /// Set or clear failure injection; decided per call after its hold and latency.
    pub fn set_failure(&self, failure: Option<FailureMode>) {
        self.inner.shared.set_failure(failure);
    }

    /// Set the latency added to each billable call from now on.
    pub fn set_latency(&self, latency: Duration) {
        self.inner.shared.set_latency(latency);
    }

    /// When on, SSE streams stop after their first content chunk (an Anthropic stream after its
    /// first `content_block_delta`, a Gemini stream, SSE or JSON array, after its first chunk),
    /// with no `finish_reason`, usage, `[DONE]`, `message_stop` or `finishReason`, by aborting
    /// the connection mid-body.
    pub fn set_truncate_streams(&self, on: bool) {
        self.inner.shared.set_truncate_streams(on);
    }

    /// From now on, a streamed chat answer (`/v1/chat/completions` with `stream: true`) is
    /// padded with more content chunks of its first choice, one word each, until its body is
    /// at least `bytes` long; 0 streams answers as they are. Gemini's streams are padded the
    /// same way (more chunks of its candidate); other formats are not padded.
    pub fn set_stream_padding(&self, bytes: usize) {
        self.inner
            .shared
            .stream_padding
            .store(bytes, Ordering::Relaxed);
    }

    /// From now on, every streamed answer sends all but its final event (chat: `data: [DONE]`;
    /// Gemini: the chunk with `finishReason`)
    /// and then waits, counted in [`streams_at_end`](Self::streams_at_end), until
    /// [`release_stream_ends`](Self::release_stream_ends): streams a test keeps live for as long
    /// as it needs them.
    pub fn hold_stream_ends(&self) {
        self.inner.shared.set_stream_ends_held(true);
    }

    /// Let every stream waiting at its end send its final event, and stop holding.
    pub fn release_stream_ends(&self) {
        self.inner.shared.set_stream_ends_held(false);
    }

    /// Streams waiting at their end now, and the bytes they sent before it.
    pub fn streams_at_end(&self) -> StreamsAtEnd {
        self.inner.shared.streams_at_end()
    }

    /// Wait until at least `n` streams wait at their end; false if `timeout` passed first.
    /// Woken by each arrival, like [`wait_for_calls`](Self::wait_for_calls).
    pub async fn wait_for_streams_at_end(&self, n: usize, timeout: Duration) -> bool {
        self.inner.shared.wait_for_streams_at_end(n, timeout).await
    }

    /// From now on, every streamed answer sends its response head and then waits before its
    /// first event, counted in [`streams_at_start`](Self::streams_at_start), until
    /// [`release_stream_starts`](Self::release_stream_starts): a model thinking for as long as
    /// a test needs it silent.
    pub fn hold_stream_starts(&self) {
        self.inner.shared.set_stream_starts_held(true);
    }

    /// Let every stream waiting at its start send its events, and stop holding.
    pub fn release_stream_starts(&self) {
        self.inner.shared.set_stream_starts_held(false);
    }

    /// Streams that sent their response head and wait before their first event now.
    pub fn streams_at_start(&self) -> usize {
        self.inner.shared.streams_at_start()
    }

    /// Wait until at least `n` streams wait at their start; false if `timeout` passed first.
    pub async fn wait_for_streams_at_start(&self, n: usize, timeout: Duration) -> bool {
        self.inner
            .shared
            .wait_for_streams_at_start(n, timeout)
            .await
    }

    /// Embeddings inputs embedded so far, over every successful `/v1/embeddings` call and
    /// Gemini `:embedContent`/`:batchEmbedContents` call: a batch of five inputs counts five.
    pub fn embedded_inputs(&self) -> u64 {
        self.inner.shared.embedded_inputs()
    }

    /// How many times each input was embedded (text, or the canonical JSON of token ids).
    pub fn embedded_counts(&self) -> BTreeMap<String, u64> {
        lock(&self.inner.shared.ledger).embedded.clone()
    }

    /// Every billable request received since start or the last reset, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.inner.shared.ledger).requests.clone()
    }

    /// Every request received since start or the last reset, billable or not, known path or
    /// not (admin calls excepted), as `METHOD /path?query` in arrival order: what a test
    /// checks to prove that nothing reached the provider.
    pub fn received(&self) -> Vec<String> {
        lock(&self.inner.shared.received).clone()
    }

    /// Back to the state right after start: counters, recorded requests and scripts cleared,
    /// held calls and stream ends released, failure, latency and truncation as in the startup
    /// settings, no padding; Azure keys and the Entra client as in the settings, no queued
    /// token lifetimes (Entra's and Google's), token requests and refused Azure requests
    /// cleared. Tokens already issued stay valid until they expire. Bedrock's credentials, region
    /// and API keys as in the settings, its refused requests and verified-signature count cleared.
    pub fn reset(&self) {
        self.inner.shared.reset();
    }
}

/// State shared by the server task, its handlers and every [`MockProvider`] handle.
struct Shared {
    settings: MockSettings,
    latency: Mutex<Duration>,
    failure: Mutex<Option<FailureMode>>,
    truncate_streams: AtomicBool,
    /// Body size streamed chat and Gemini answers are padded to (0: none).
    stream_padding: AtomicUsize,
    stream_ends: watch::Sender<delivery::StreamEnds>,
    stream_starts: watch::Sender<stream_starts::StreamStarts>,
    ledger: Mutex<Ledger>,
    /// Every non-admin request line, billable or not (see [`MockProvider::received`]).
    received: Mutex<Vec<String>>,
    /// The call counter lives in a watch channel so waiters are woken by each arrival.
    calls: watch::Sender<u64>,
    hold: watch::Sender<HoldState>,
    /// Cancelled when the server begins shutting down, to let go of held calls and long polls.
    stopping: CancellationToken,
    /// Azure's door: the accepted keys and the requests it turned away.
    azure: azure::Door,
    /// Entra's token endpoint: the known client, queued lifetimes, issued tokens.
    entra: entra::Entra,
    /// Google's token endpoint: queued lifetimes, issued tokens (Vertex AI's door).
    google: google_token::GoogleTokens,
    /// Bedrock's door: credentials, API keys, refused requests, verified signatures.
    bedrock: bedrock::Door,
}

/// What is recorded per call; one lock so the count, the record and the script popped for a
/// call always agree.
#[derive(Default)]
struct Ledger {
    by_path: BTreeMap<String, u64>,
    /// How many times each embeddings input was embedded (answered successfully).
    embedded: BTreeMap<String, u64>,
    requests: Vec<RecordedRequest>,
    scripts: VecDeque<Scripted>,
}

/// Whether calls are held, plus a generation bumped on every release.
///
/// A held call waits for its own generation to end rather than for `held == false`, so a release
/// immediately followed by a new hold still lets it go.
#[derive(Debug, Clone, Copy, Default)]
struct HoldState {
    held: bool,
    generation: u64,
}

/// What a billable call took from the ledger when it arrived.
struct Arrival {
    call: u64,
    script: Option<Scripted>,
    /// The hold generation to wait out, if calls were held when this one arrived.
    held_in: Option<u64>,
}

impl Shared {
    fn new(settings: MockSettings) -> Self {
        Self {
            latency: Mutex::new(settings.latency),
            failure: Mutex::new(settings.failure.clone()),
            truncate_streams: AtomicBool::new(false),
            stream_padding: AtomicUsize::new(0),
            stream_ends: watch::Sender::new(delivery::StreamEnds::default()),
            stream_starts: watch::Sender::new(stream_starts::StreamStarts::default()),
            ledger: Mutex::new(Ledger::default()),
            received: Mutex::new(Vec::new()),
            calls: watch::Sender::new(0),
            hold: watch::Sender::new(HoldState::default()),
            stopping: CancellationToken::new(),
            azure: azure::Door::new(settings.azure_keys.clone()),
            entra: entra::Entra::new(settings.entra_client.clone()),
            google: google_token::GoogleTokens::default(),
            bedrock: bedrock::Door::new(settings.bedrock.clone()),
            settings,
        }
    }

    fn calls(&self) -> u64 {
        *self.calls.borrow()
    }

    fn calls_to(&self, path_suffix: &str) -> u64 {
        lock(&self.ledger)
            .by_path
            .iter()
            .filter(|(path, _)| path.ends_with(path_suffix))
            .map(|(_, n)| n)
            .sum()
    }

    fn embedded_inputs(&self) -> u64 {
        lock(&self.ledger).embedded.values().sum()
    }

    /// Counts the inputs a successful embeddings call embedded.
    fn embedded(&self, inputs: Vec<String>) {
        let mut ledger = lock(&self.ledger);
        for input in inputs {
            *ledger.embedded.entry(input).or_default() += 1;
        }
    }

    fn by_path(&self) -> BTreeMap<String, u64> {
        lock(&self.ledger).by_path.clone()
    }

    /// Wait until `calls() >= n`, the timeout passes or the server stops; true if reached.
    async fn wait_for_calls(&self, n: u64, timeout: Duration) -> bool {
        let mut calls = self.calls.subscribe();
        tokio::select! {
            reached = tokio::time::timeout(timeout, calls.wait_for(|c| *c >= n)) => {
                matches!(reached, Ok(Ok(_)))
            }
            () = self.stopping.cancelled() => self.calls() >= n,
        }
    }

    fn set_hold(&self, held: bool) {
        self.hold.send_modify(|state| {
            if state.held && !held {
                state.generation += 1;
            }
            state.held = held;
        });
    }

    fn push_script(&self, script: Scripted) {
        lock(&self.ledger).scripts.push_back(script);
    }

    fn set_failure(&self, failure: Option<FailureMode>) {
        *lock(&self.failure) = failure;
    }

    fn set_latency(&self, latency: Duration) {
        *lock(&self.latency) = latency;
    }

    fn set_truncate_streams(&self, on: bool) {
        self.truncate_streams.store(on, Ordering::Relaxed);
    }

    fn latency(&self) -> Duration {
        *lock(&self.latency)
    }

    fn failure(&self) -> Option<FailureMode> {
        lock(&self.failure).clone()
    }

    fn truncate_streams(&self) -> bool {
        self.truncate_streams.load(Ordering::Relaxed)
    }

    fn stream_padding(&self) -> usize {
        self.stream_padding.load(Ordering::Relaxed)
    }

    /// Count and record a billable call, and take the script it will answer with, if any.
    fn arrive(&self, request: RecordedRequest) -> Arrival {
        let mut ledger = lock(&self.ledger);
        let mut call = 0;
        self.calls.send_modify(|calls| {
            *calls += 1;
            call = *calls;
        });
        *ledger.by_path.entry(request.path.clone()).or_default() += 1;
        ledger.requests.push(request);
        let script = ledger.scripts.pop_front();
        drop(ledger);
        let hold = *self.hold.borrow();
        Arrival {
            call,
            script,
            held_in: hold.held.then_some(hold.generation),
        }
    }

    /// Block while the hold generation the call arrived in lasts; shutdown lets it go too.
    async fn wait_out_hold(&self, generation: u64) {
        let mut hold = self.hold.subscribe();
        tokio::select! {
            _ = hold.wait_for(|state| !state.held || state.generation != generation) => {}
            () = self.stopping.cancelled() => {}
        }
    }

    fn reset(&self) {
        let mut ledger = lock(&self.ledger);
        *ledger = Ledger::default();
        self.calls.send_replace(0);
        drop(ledger);
        lock(&self.received).clear();
        self.set_hold(false);
        *lock(&self.failure) = self.settings.failure.clone();
        *lock(&self.latency) = self.settings.latency;
        self.truncate_streams.store(false, Ordering::Relaxed);
        self.stream_padding.store(0, Ordering::Relaxed);
        self.set_stream_ends_held(false);
        self.set_stream_starts_held(false);
        self.azure.reset();
        self.entra.reset();
        self.google.reset();
        self.bedrock.reset();
    }
}

/// Serve `shared` on `listener` until `shutdown` completes, then drain for at most
/// [`SHUTDOWN_GRACE`].
async fn run(
    listener: TcpListener,
    shared: Arc<Shared>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let addr = listener
        .local_addr()
        .context("mock provider: reading the bound address")?;
    let stopping = shared.stopping.clone();
    let signal = {
        let stopping = stopping.clone();
        async move {
            shutdown.await;
            stopping.cancel();
        }
    };
    tracing::debug!(%addr, "mock provider serving");
    let server = axum::serve(listener, http::router(shared)).with_graceful_shutdown(signal);
    tokio::select! {
        served = server.into_future() => served.context("mock provider: serving HTTP")?,
        () = async {
            stopping.cancelled().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => {
            tracing::warn!(%addr, "mock provider stopped with connections still open");
        }
    }
    tracing::debug!(%addr, "mock provider stopped");
    Ok(())
}

/// Lock a mutex, ignoring poisoning: every critical section here leaves the data consistent,
/// and a panicked test thread must not turn into a panic inside the server.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
