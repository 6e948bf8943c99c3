//! Claude Code 2.x headless in its Bedrock and Vertex AI modes, pointed at
//! corral as its users on those clouds would point it at a gateway: its
//! cloud SDK's base URL is corral, its own cloud auth is skipped, and the
//! gateway key rides beside in `ANTHROPIC_CUSTOM_HEADERS`. corral serves the
//! cloud's paths as Messages requests for the public model (its `deployments`
//! say which cloud id is which model), in front of an Anthropic mock member.

use std::collections::BTreeSet;

use corral::{
    Config,
    config::{Affinity, Api, MemberConfig, ProviderKind, Secret},
    tenant::key_hash,
};
use mock_upstream::{MockProvider, MockSettings};
use percent_encoding::percent_decode_str;
use serde_json::Value;
use tokio::process::Command;

use crate::{
    agents::{
        CLAUDE_QUIET, CLAUDE_TASK, CLIENT_TIMEOUT, Scratch, describe, differing_fields,
        install::NodeClients,
        is_2xx,
        run::{Finished, clean_command, run},
        tap::{Exchange, Tap},
    },
    harness::TestGateway,
    pools::{closed_port, member, pooled},
};

/// The key Claude Code's runs send beside their cloud's request.
const GATEWAY_KEY: &str = "gw-claude-code-clouds";

/// A model Claude Code is told to use, by its public name and as each cloud
/// names it.
struct Model {
    public: &'static str,
    bedrock: &'static str,
    vertex: &'static str,
}

/// The main model (`ANTHROPIC_MODEL`).
const SONNET: Model = Model {
    public: "claude-sonnet-4-5",
    bedrock: "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
    vertex: "claude-sonnet-4-5@20250929",
};

/// The small, fast model Claude Code uses for side tasks.
const HAIKU: Model = Model {
    public: "claude-haiku-4-5",
    bedrock: "us.anthropic.claude-haiku-4-5-20251001-v1:0",
    vertex: "claude-haiku-4-5@20251001",
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cloud {
    Bedrock,
    Vertex,
}

impl Cloud {
    fn model_id(self, model: &Model) -> &'static str {
        match self {
            Self::Bedrock => model.bedrock,
            Self::Vertex => model.vertex,
        }
    }

    /// The model id in `target` when it is one of this cloud's model calls:
    /// Bedrock's `/model/{id}/invoke[-with-response-stream]`, Vertex AI's
    /// `/v1/projects/{p}/locations/{l}/publishers/anthropic/models/{id}:[stream]rawPredict`.
    fn model_id_in(self, target: &str) -> Option<String> {
        let path = target.split('?').next()?;
        let id = match self {
            Self::Bedrock => {
                let (id, method) = path.strip_prefix("/model/")?.rsplit_once('/')?;
                ["invoke", "invoke-with-response-stream"]
                    .contains(&method)
                    .then_some(id)?
            }
            Self::Vertex => {
                let (_, model) = path.split_once("/publishers/anthropic/models/")?;
                let (id, method) = model.rsplit_once(':')?;
                (path.starts_with("/v1/projects/")
                    && ["rawPredict", "streamRawPredict"].contains(&method))
                .then_some(id)?
            }
        };
        Some(percent_decode_str(id).decode_utf8_lossy().into_owned())
    }

    /// The betas a model call asks for, as the cloud reads them: Bedrock
    /// from the body's `anthropic_beta`, Vertex AI from the `anthropic-beta`
    /// header.
    fn betas(self, call: &Exchange) -> Option<String> {
        match self {
            Self::Bedrock => {
                let betas = call.json()["anthropic_beta"].as_array()?.clone();
                let names: Vec<&str> = betas.iter().filter_map(Value::as_str).collect();
                (!names.is_empty()).then(|| names.join(","))
            }
            Self::Vertex => call.header("anthropic-beta").map(str::to_owned),
        }
    }

    /// Claude Code's settings for this cloud, with `url` as the cloud's
    /// endpoint and no cloud credentials.
    fn env(self, url: &str) -> Vec<(&'static str, String)> {
        match self {
            Self::Bedrock => vec![
                ("CLAUDE_CODE_USE_BEDROCK", "1".to_owned()),
                ("ANTHROPIC_BEDROCK_BASE_URL", url.to_owned()),
                ("CLAUDE_CODE_SKIP_BEDROCK_AUTH", "1".to_owned()),
                ("AWS_REGION", "us-east-1".to_owned()),
            ],
            Self::Vertex => vec![
                ("CLAUDE_CODE_USE_VERTEX", "1".to_owned()),
                ("ANTHROPIC_VERTEX_BASE_URL", format!("{url}/v1")),
                ("CLAUDE_CODE_SKIP_VERTEX_AUTH", "1".to_owned()),
                ("ANTHROPIC_VERTEX_PROJECT_ID", "corral-tests".to_owned()),
                ("CLOUD_ML_REGION", "us-east5".to_owned()),
            ],
        }
    }
}

/// The first upstream an Anthropic pool whose Anthropic member (the mock)
/// takes every call; Bedrock and Vertex members behind it, where nothing
/// listens, say by their `deployments` which cloud id is which model.
fn cloud_pool(config: &mut Config, mock: &MockProvider, nowhere: String) {
    config.auth.key_hashes = vec![key_hash(GATEWAY_KEY.as_bytes())];
    let upstream = &mut config.upstreams[0];
    upstream.api = Api::Anthropic;
    upstream.models = vec!["claude-*".to_owned()];
    let mut first = member("anthropic", mock.base_url());
    first.api_key = Some(Secret::new("sk-ant-member".to_owned()));
    let mut bedrock = cloud_member("bedrock", nowhere.clone(), Cloud::Bedrock);
    bedrock.region = Some("us-east-1".to_owned());
    bedrock.aws = Some(crate::bedrock::aws_keys("AKIDEXAMPLE", "not-a-real-secret"));
    bedrock.priority = 1;
    let mut vertex = cloud_member("vertex", nowhere, Cloud::Vertex);
    vertex.service_account = Some(Secret::new(mock.service_account_json()));
    vertex.priority = 2;
    pooled(config, vec![first, bedrock, vertex], Affinity::None);
}

/// A `cloud` member at `base_url` deploying [`SONNET`] and [`HAIKU`] by
/// the cloud's ids; its credentials are the caller's to add.
fn cloud_member(name: &str, base_url: String, cloud: Cloud) -> MemberConfig {
    let provider = match cloud {
        Cloud::Bedrock => ProviderKind::Bedrock,
        Cloud::Vertex => ProviderKind::Vertex,
    };
    let id = |model: &Model| cloud.model_id(model);
    let mut cloud = member(name, base_url);
    cloud.provider = Some(provider);
    cloud.api_key = None;
    cloud.deployments = [&SONNET, &HAIKU]
        .into_iter()
        .map(|model| (model.public.to_owned(), id(model).to_owned()))
        .collect();
    cloud
}

async fn cloud_gateway(adjust: impl FnOnce(&mut Config)) -> TestGateway {
    let mock = MockProvider::start(MockSettings::default())
        .await
        .expect("mock provider starts");
    let nowhere = closed_port().await;
    TestGateway::start_with(mock.clone(), |config| {
        cloud_pool(config, &mock, nowhere);
        adjust(config);
    })
    .await
}

/// One developer's machine in front of corral: a HOME and a working
/// directory shared by every run (as a developer's terminals share them, so
/// the runs' environment in the prompt is one), and a tap that records what
/// every run sent.
struct Desk {
    clients: &'static NodeClients,
    scratch: Scratch,
    tap: Tap,
}

impl Desk {
    async fn new(gateway: &TestGateway) -> Self {
        Self {
            clients: NodeClients::get().await,
            scratch: Scratch::new(),
            tap: Tap::start(&gateway.url).await,
        }
    }

    /// `claude -p` of [`CLAUDE_TASK`] in `cloud`'s mode, the cloud's base
    /// URL the tap's, the models the cloud's ids of [`SONNET`] and [`HAIKU`].
    fn claude(&self, cloud: Cloud) -> Command {
        let Self {
            clients, scratch, ..
        } = self;
        let mut command = clean_command(clients.claude(), &scratch.home);
        command
            .args(["-p", CLAUDE_TASK])
            .current_dir(&scratch.work)
            .env("CLAUDE_CONFIG_DIR", scratch.home.join(".claude"))
            .env(
                "ANTHROPIC_CUSTOM_HEADERS",
                format!("x-api-key: {GATEWAY_KEY}"),
            )
            .env("ANTHROPIC_MODEL", cloud.model_id(&SONNET))
            .env("ANTHROPIC_SMALL_FAST_MODEL", cloud.model_id(&HAIKU))
            .envs(cloud.env(&self.tap.url))
            .envs(CLAUDE_QUIET);
        command
    }

    /// A run of [`Self::claude`] in its own task, bounded by [`CLIENT_TIMEOUT`].
    fn spawn(&self, cloud: Cloud) -> tokio::task::JoinHandle<Finished> {
        tokio::spawn(run(self.claude(cloud), CLIENT_TIMEOUT, "claude -p"))
    }

    /// Every request the runs sent so far.
    fn exchanges(&self) -> Vec<Exchange> {
        self.tap.exchanges()
    }
}

/// The requests that were the cloud's model calls.
fn model_calls(cloud: Cloud, exchanges: &[Exchange]) -> Vec<&Exchange> {
    exchanges
        .iter()
        .filter(|exchange| cloud.model_id_in(&exchange.target).is_some())
        .collect()
}

/// Every request, and what each run printed: what a failure has to show.
fn run_context(exchanges: &[Exchange], runs: &[Finished]) -> String {
    let printed: Vec<String> = runs
        .iter()
        .map(|run| format!("stdout: {}\nstderr: {}", run.stdout, run.stderr))
        .collect();
    format!("sent: {}\n{}", describe(exchanges), printed.join("\n"))
}

/// Claude Code's runs in `cloud`'s mode ended well: each exited 0 and
/// printed the mock's answer, each of their model calls (at least one)
/// named a model id the pool deploys and was answered 2xx, and nothing else
/// they sent was refused but what [`unserved`] names.
fn assert_completed(cloud: Cloud, exchanges: &[Exchange], runs: &[Finished]) {
    let context = run_context(exchanges, runs);
    for finished in runs {
        assert!(
            finished.status.success(),
            "claude -p exited {}; {context}",
            finished.status
        );
        assert!(
            finished.stdout.contains("mock reply to "),
            "the mock's answer is printed; {context}"
        );
    }
    let calls = model_calls(cloud, exchanges);
    assert!(
        calls.len() >= runs.len(),
        "every run called a model; {context}"
    );
    for call in &calls {
        let id = cloud.model_id_in(&call.target).unwrap_or_default();
        assert!(
            [&SONNET, &HAIKU]
                .iter()
                .any(|model| cloud.model_id(model) == id),
            "{id} is a model id the pool deploys; {context}"
        );
        assert!(is_2xx(call), "{}; {context}", call.summary());
    }
    let refused: Vec<String> = exchanges
        .iter()
        .filter(|exchange| !is_2xx(exchange) && !unserved(cloud, exchange))
        .map(Exchange::summary)
        .collect();
    assert!(refused.is_empty(), "refused: {refused:#?}\n{context}");
}

/// Requests Claude Code makes in `cloud`'s mode that corral does not serve,
/// and that Claude Code goes on without: none. (In Bedrock mode it first asks
/// its base URL for Bedrock's control-plane `ListInferenceProfiles`, from the
/// AWS SDK and so without the gateway key; corral answers it with no profiles.)
fn unserved(_cloud: Cloud, _exchange: &Exchange) -> bool {
    false
}

/// What the Anthropic member was sent: Messages calls for the public model
/// names, with the member's own key (not the caller's gateway key) and none
/// of the cloud's body fields, which Anthropic's API would refuse.
fn assert_member_saw_messages(gateway: &TestGateway, context: &str) {
    let received = gateway.provider.requests();
    assert!(!received.is_empty(), "{context}");
    for request in &received {
        assert_eq!(request.path, "/v1/messages", "{context}");
        let body = request.json().unwrap_or_default();
        let model = body["model"].as_str().unwrap_or_default();
        assert!(
            [SONNET.public, HAIKU.public].contains(&model),
            "the public name goes upstream, not {model:?}; {context}"
        );
        assert!(
            body.get("anthropic_version").is_none() && body.get("anthropic_beta").is_none(),
            "the cloud's fields stay behind; {context}"
        );
        assert_eq!(
            request.header("x-api-key"),
            Some("sk-ant-member"),
            "{context}"
        );
    }
}

async fn completes_through_corral(cloud: Cloud) {
    let gateway = cloud_gateway(|_| {}).await;
    let desk = Desk::new(&gateway).await;
    let finished = desk.spawn(cloud).await.expect("the run's task");
    let exchanges = desk.exchanges();
    eprintln!("claude -p in {cloud:?} mode sent: {}", describe(&exchanges));
    let runs = [finished];
    assert_completed(cloud, &exchanges, &runs);
    let context = run_context(&exchanges, &runs);
    assert_member_saw_messages(&gateway, &context);
    // The betas Claude Code asked the cloud for are the member's: Bedrock
    // reads them from the body (its `anthropic-beta` header, which Bedrock
    // ignores, is not sent on), Vertex AI from the header.
    let asked: BTreeSet<Option<String>> = model_calls(cloud, &exchanges)
        .into_iter()
        .map(|call| cloud.betas(call))
        .collect();
    let sent: BTreeSet<Option<String>> = gateway
        .provider
        .requests()
        .iter()
        .map(|request| request.header("anthropic-beta").map(str::to_owned))
        .collect();
    assert_eq!(sent, asked, "{context}");
    // Each went upstream (none was answered from elsewhere); identical ones may have shared.
    let calls = gateway.provider.calls_to("/v1/messages");
    assert!(
        (1..=model_calls(cloud, &exchanges).len() as u64).contains(&calls),
        "{calls} upstream calls; {context}"
    );
}

/// Two terminals of one developer running one task at once make one
/// upstream call (their requests differ only in the session id inside
/// `metadata.user_id`, which corral does not key on); and, sampled answers
/// being stored here, a later run of the task is answered from the store:
/// the mock's count does not grow.
async fn runs_of_one_task_share_their_call(cloud: Cloud) {
    const RUNS: usize = 2;
    let gateway = cloud_gateway(|config| config.cache.sampled = true).await;
    let desk = Desk::new(&gateway).await;
    gateway.provider.hold();
    let runs: Vec<_> = (0..RUNS).map(|_| desk.spawn(cloud)).collect();
    gateway.wait_for_waiters(RUNS).await;
    gateway.provider.release();
    let mut together = Vec::new();
    for task in runs {
        together.push(task.await.expect("the run's task"));
    }
    let exchanges = desk.exchanges();
    assert_completed(cloud, &exchanges, &together);
    let calls = model_calls(cloud, &exchanges);
    let bodies: Vec<Value> = calls.iter().map(|call| call.json()).collect();
    let answers: BTreeSet<&str> = together.iter().map(|run| run.stdout.trim()).collect();
    let context = format!(
        "answers: {answers:#?}\nrequests: {:#?}\nthe runs' request bodies differ at:\n  {}",
        calls.iter().map(|call| call.summary()).collect::<Vec<_>>(),
        differing_fields(&bodies)
    );
    assert_eq!(calls.len(), RUNS, "one model call per run; {context}");
    assert_eq!(
        gateway.provider.calls_to("/v1/messages"),
        1,
        "one upstream call for the runs; {context}"
    );
    assert_eq!(
        answers.len(),
        1,
        "every run printed the same answer; {context}"
    );
    assert_member_saw_messages(&gateway, &context);

    let later = desk.spawn(cloud).await.expect("the later run's task");
    let exchanges = desk.exchanges().split_off(exchanges.len());
    let later = [later];
    assert_completed(cloud, &exchanges, &later);
    let context = run_context(&exchanges, &later);
    let statuses: Vec<&str> = model_calls(cloud, &exchanges)
        .iter()
        .map(|call| call.cache.as_str())
        .collect();
    assert_eq!(statuses, ["HIT"], "the later run is served; {context}");
    assert_eq!(
        gateway.provider.calls_to("/v1/messages"),
        1,
        "no call for the later run; {context}"
    );
    assert!(
        answers.contains(later[0].stdout.trim()),
        "the later run printed the same answer; {context}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_in_bedrock_mode_completes_a_task_through_corral() {
    completes_through_corral(Cloud::Bedrock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_runs_of_one_task_in_bedrock_mode_share_their_call() {
    runs_of_one_task_share_their_call(Cloud::Bedrock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_in_vertex_mode_completes_a_task_through_corral() {
    completes_through_corral(Cloud::Vertex).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_runs_of_one_task_in_vertex_mode_share_their_call() {
    runs_of_one_task_share_their_call(Cloud::Vertex).await;
}
