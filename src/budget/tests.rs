use std::sync::atomic::{AtomicBool, Ordering};

use super::*;
use crate::clock::ManualClock;

/// 2026-12-05T10:30:00Z
const NOW: u64 = 1_796_466_600_000;

fn rule(tenant: Option<&str>, upstream: Option<&str>, usd: f64, per: &str) -> BudgetRule {
    BudgetRule {
        tenant: tenant.map(str::to_owned),
        upstream: upstream.map(str::to_owned),
        usd,
        per: per.parse().unwrap(),
    }
}

fn budgets(
    rules: Vec<BudgetRule>,
    store: Option<Arc<dyn BudgetStore>>,
) -> (Budgets, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(NOW));
    (Budgets::new(rules, None, 100, clock.clone(), store), clock)
}

fn name(text: &str) -> Arc<str> {
    text.into()
}

/// $0.004 at the price table's picodollars.
const FOUR_MILLIDOLLARS: u128 = 4_000_000_000;

fn refusal(result: Result<(), GatewayError>) -> (Duration, String, &'static str) {
    match result {
        Err(GatewayError::BudgetExceeded {
            retry_after,
            what,
            code,
        }) => (retry_after, what, code),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn a_tenant_is_served_until_its_spend_reaches_the_budget_and_others_are_not() {
    let (budgets, clock) = budgets(
        vec![
            rule(Some("*"), None, 0.01, "day"),
            rule(Some("team-b"), None, 1.0, "day"),
        ],
        None,
    );
    let (a, b, up) = (name("a"), name("team-b"), name("openai"));
    for _ in 0..2 {
        budgets.admit(&a, &up).await.unwrap();
        budgets.spend(&a, &up, Some(FOUR_MILLIDOLLARS), 100);
    }
    assert_eq!(budgets.remaining_usd(&a), Some(0.002));
    budgets.admit(&a, &up).await.expect("$0.008 of $0.01 spent");
    budgets.spend(&a, &up, Some(FOUR_MILLIDOLLARS), 100);
    let (retry_after, what, code) = refusal(budgets.admit(&a, &up).await);
    assert_eq!(code, "budget_exceeded");
    assert_eq!(
        retry_after,
        Duration::from_secs(13 * 3600 + 1800),
        "to UTC midnight"
    );
    assert!(
        what.contains("every tenant") && what.contains("0.01") && what.contains("day"),
        "{what}"
    );
    assert_eq!(budgets.remaining_usd(&a), Some(0.0), "never below 0");
    // Another tenant under the `*` rule has its own budget; a named one its own rule.
    budgets.admit(&name("c"), &up).await.unwrap();
    budgets.spend(&b, &up, Some(FOUR_MILLIDOLLARS * 3), 100);
    budgets.admit(&b, &up).await.expect("team-b has $1");
    // The next day starts afresh.
    clock.advance(Duration::from_secs(13 * 3600 + 1800));
    budgets.admit(&a, &up).await.expect("a new window");
    let uses = budgets.uses();
    assert!(uses.iter().all(|used| used.spent_usd == 0.0), "{uses:?}");
}

#[tokio::test]
async fn an_upstream_cap_refuses_every_tenant_and_short_windows_roll_over() {
    let (budgets, clock) = budgets(vec![rule(None, Some("openai"), 0.001, "10s")], None);
    let (a, b, up, other) = (name("a"), name("b"), name("openai"), name("anthropic"));
    budgets.spend(&a, &up, Some(FOUR_MILLIDOLLARS), 10);
    let (retry_after, what, _) = refusal(budgets.admit(&b, &up).await);
    assert!(what.contains("upstream openai"), "{what}");
    assert!(retry_after <= Duration::from_secs(10));
    budgets
        .admit(&b, &other)
        .await
        .expect("another upstream is not capped");
    clock.advance(retry_after);
    budgets
        .admit(&b, &up)
        .await
        .expect("the window rolled over");
}

#[tokio::test]
async fn the_token_rate_counts_billed_tokens_per_minute() {
    let clock = Arc::new(ManualClock::new(NOW));
    let budgets = Budgets::new(Vec::new(), Some(1000), 100, clock.clone(), None);
    let (a, up) = (name("a"), name("openai"));
    budgets.spend(&a, &up, None, 999);
    budgets.admit(&a, &up).await.unwrap();
    budgets.spend(&a, &up, None, 1);
    let (retry_after, _, code) = refusal(budgets.admit(&a, &up).await);
    assert_eq!(code, "token_rate_exceeded");
    assert_eq!(retry_after, Duration::from_secs(60), "10:30:00 to 10:31:00");
    budgets.admit(&name("b"), &up).await.unwrap();
    clock.advance(retry_after);
    budgets.admit(&a, &up).await.unwrap();
}

/// Redis' semantics in memory: batches applied once by id.
#[derive(Debug, Default)]
struct FakeStore {
    windows: Mutex<HashMap<String, HashMap<String, i64>>>,
    applied: Mutex<HashSet<String>>,
    lose_reply: AtomicBool,
}

#[async_trait]
impl BudgetStore for FakeStore {
    async fn apply(
        &self,
        batch: &BudgetBatch,
        read: &[String],
    ) -> Result<Vec<(String, Vec<(String, i64)>)>, BudgetsUnavailable> {
        let mut windows = self.windows.lock().unwrap();
        if self.applied.lock().unwrap().insert(batch.id.clone()) {
            for line in &batch.lines {
                *windows
                    .entry(line.window_id.clone())
                    .or_default()
                    .entry(line.field.clone())
                    .or_default() += line.delta as i64;
            }
        }
        if self.lose_reply.swap(false, Ordering::SeqCst) {
            return Err(BudgetsUnavailable);
        }
        Ok(read
            .iter()
            .map(|id| {
                let fields = windows.get(id).cloned().unwrap_or_default();
                (id.clone(), fields.into_iter().collect())
            })
            .collect())
    }
}

#[tokio::test]
async fn instances_sharing_a_store_count_each_others_spend_once_and_a_restart_reads_it_back() {
    let store = Arc::new(FakeStore::default());
    let shared = || Some(store.clone() as Arc<dyn BudgetStore>);
    let rules = vec![rule(Some("*"), None, 0.01, "day")];
    let (one, _) = budgets(rules.clone(), shared());
    let (two, _) = budgets(rules.clone(), shared());
    let (a, up) = (name("a"), name("openai"));
    one.admit(&a, &up).await.unwrap();
    two.admit(&a, &up).await.unwrap();
    one.spend(&a, &up, Some(FOUR_MILLIDOLLARS), 1);
    two.spend(&a, &up, Some(FOUR_MILLIDOLLARS), 1);
    // A lost reply: the batch was applied; its resend must add nothing.
    store.lose_reply.store(true, Ordering::SeqCst);
    assert!(one.flush().await.is_err());
    one.flush().await.unwrap();
    two.flush().await.unwrap();
    one.flush().await.unwrap();
    assert_eq!(one.remaining_usd(&a), Some(0.002));
    assert_eq!(two.remaining_usd(&a), Some(0.002));
    one.spend(&a, &up, Some(FOUR_MILLIDOLLARS), 1);
    one.flush().await.unwrap();
    refusal(one.admit(&a, &up).await);
    // A fresh instance (a restart) refuses from its first check.
    let (restarted, _) = budgets(rules, shared());
    refusal(restarted.admit(&a, &up).await);
}

#[test]
fn a_cost_is_rounded_up_to_whole_nanodollars_and_huge_ones_saturate() {
    let (budgets, _) = budgets(vec![rule(Some("*"), None, 0.000_000_002, "hour")], None);
    let (a, up) = (name("a"), name("x"));
    budgets.spend(&a, &up, Some(1), 0);
    assert_eq!(budgets.remaining_usd(&a), Some(0.000_000_001));
    budgets.spend(&a, &up, Some(u128::MAX), 0);
    assert_eq!(budgets.remaining_usd(&a), Some(0.0));
    assert!(budgets.check(Some(&a), &up).is_err());
}

#[test]
fn ended_windows_are_forgotten_without_a_store_too() {
    let (budgets, clock) = budgets(vec![rule(Some("*"), None, 1.0, "1s")], None);
    let (a, up) = (name("a"), name("x"));
    for _ in 0..100 {
        budgets.spend(&a, &up, Some(1_000), 1);
        clock.advance(Duration::from_secs(1));
    }
    assert_eq!(
        budgets.lock().counts.len(),
        1,
        "only the current window is kept"
    );
}

#[test]
fn a_tenant_is_told_only_its_own_budgets_and_metrics_see_rules_not_tenants() {
    let (budgets, _) = budgets(
        vec![
            rule(Some("*"), None, 0.01, "day"),
            rule(Some("team-b"), None, 1.0, "day"),
            rule(None, Some("openai"), 0.005, "day"),
        ],
        None,
    );
    let (a, c, b, up) = (name("a"), name("c"), name("team-b"), name("openai"));
    budgets.spend(&a, &up, Some(FOUR_MILLIDOLLARS), 1);
    budgets.spend(&c, &up, Some(FOUR_MILLIDOLLARS / 2), 1);
    // The upstream's $0.005 is nearly spent by both; each is told its own `*` budget.
    assert_eq!(budgets.remaining_usd(&a), Some(0.006));
    assert_eq!(budgets.remaining_usd(&c), Some(0.008));
    assert_eq!(budgets.remaining_usd(&b), Some(1.0));
    let only_upstream = Budgets::new(
        vec![rule(None, Some("openai"), 1.0, "day")],
        None,
        100,
        Arc::new(ManualClock::new(NOW)),
        None,
    );
    assert_eq!(
        only_upstream.remaining_usd(&a),
        None,
        "not a tenant's budget"
    );
    // /stats: each tenant under `*`; /metrics: one use per rule, the `*`
    // rule's spend the most one tenant spent.
    assert_eq!(budgets.uses().len(), 4);
    let rules = budgets.rule_uses();
    let subjects: Vec<&str> = rules.iter().map(|used| used.subject.as_str()).collect();
    assert_eq!(
        subjects,
        ["every tenant", "tenant team-b", "upstream openai"]
    );
    assert_eq!(rules[0].spent_usd, 0.004);
    assert_eq!(rules[0].remaining_usd, 0.006);
    assert_eq!(rules[2].spent_usd, 0.006);
}

#[tokio::test]
async fn the_gateways_own_call_spends_only_the_account_caps() {
    let rules = vec![
        rule(Some("*"), None, 0.001, "hour"),
        rule(None, Some("x"), 0.005, "hour"),
    ];
    let (budgets, _) = budgets(rules, None);
    let (a, up) = (name("a"), name("x"));
    budgets.spend_for(None, &up, Some(FOUR_MILLIDOLLARS), 1_000);
    assert!(
        budgets
            .uses()
            .iter()
            .all(|used| used.subject == "upstream x"),
        "no tenant counted it: {:?}",
        budgets.uses()
    );
    assert_eq!(budgets.remaining_usd(&a), Some(0.001), "a's is whole");
    budgets.admit(&a, &up).await.unwrap();
    budgets.admit_for(None, &up).await.unwrap();
    budgets.spend_for(None, &up, Some(FOUR_MILLIDOLLARS), 1_000);
    refusal(budgets.admit_for(None, &up).await);
    refusal(budgets.admit(&a, &up).await);
}
