//! Entra ID's OAuth 2.0 client-credentials grant: an app registration's
//! client id and secret traded for an access token to Azure OpenAI.
//!
//! One request per token: `POST {authority}/{tenant}/oauth2/v2.0/token` with
//! a form body. The answer is read bounded, and a refusal is reported by
//! Entra's own error code, never with the secret or a token in its text.

use std::time::Duration;

use anyhow::{Context, bail};
use reqwest::Url;
use serde::Deserialize;

pub use super::oauth::MAX_ANSWER_BYTES;
use super::{
    oauth::{bearer_only, post_form},
    token::{Grant, Issued, TokenError},
};
use crate::config::Secret;

/// The scope of a token for Azure OpenAI (Cognitive Services) deployments.
pub const COGNITIVE_SERVICES_SCOPE: &str = "https://cognitiveservices.azure.com/.default";

/// An app registration's client credentials for one tenant.
#[derive(Debug)]
pub struct EntraGrant {
    token_url: Url,
    client_id: String,
    client_secret: Secret<String>,
    scope: String,
    client: reqwest::Client,
}

impl EntraGrant {
    /// `authority` e.g. "https://login.microsoftonline.com" (no trailing slash needed);
    /// the token is for [`COGNITIVE_SERVICES_SCOPE`] unless [`with_scope`](Self::with_scope)
    /// says otherwise. `client` brings the connection settings and timeouts.
    pub fn new(
        authority: &str,
        tenant_id: &str,
        client_id: &str,
        client_secret: Secret<String>,
        client: reqwest::Client,
    ) -> anyhow::Result<Self> {
        // A tenant is a GUID or a domain name; anything else would change
        // the path (a `/`, `..`) or the query rather than name a tenant.
        if tenant_id.is_empty()
            || tenant_id == "."
            || tenant_id == ".."
            || !tenant_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        {
            bail!("an Entra tenant id is a GUID or a domain name, not {tenant_id:?}");
        }
        if client_id.trim().is_empty() {
            bail!("an Entra client id must not be empty");
        }
        if client_secret.expose().is_empty() {
            bail!("an Entra client secret must not be empty");
        }
        let authority = authority.trim_end_matches('/');
        let token_url = Url::parse(&format!("{authority}/{tenant_id}/oauth2/v2.0/token"))
            .with_context(|| format!("the Entra authority {authority:?} is not a URL"))?;
        if !matches!(token_url.scheme(), "https" | "http")
            || token_url.query().is_some()
            || token_url.fragment().is_some()
        {
            bail!("the Entra authority {authority:?} must be an http(s) URL without query");
        }
        Ok(Self {
            token_url,
            client_id: client_id.to_owned(),
            client_secret,
            scope: COGNITIVE_SERVICES_SCOPE.to_owned(),
            client,
        })
    }

    /// The same grant, asking for tokens of `scope` (e.g. another resource's `/.default`).
    pub fn with_scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = scope.into();
        self
    }
}

#[async_trait::async_trait]
impl Grant for EntraGrant {
    async fn issue(&self) -> Result<Issued, TokenError> {
        let form = [
            ("grant_type", "client_credentials"),
            ("client_id", self.client_id.as_str()),
            ("client_secret", self.client_secret.expose().as_str()),
            ("scope", self.scope.as_str()),
        ];
        let answer: TokenAnswer = post_form(&self.client, self.token_url.clone(), &form).await?;
        bearer_only(answer.token_type.as_deref())?;
        Ok(Issued {
            token: Secret::new(answer.access_token),
            lifetime: answer.expires_in.lifetime()?,
        })
    }
}

/// The parts of Entra's answer that are used. Entra also sends `ext_expires_in`,
/// which is for its own outages and not when to refresh.
#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    expires_in: Seconds,
    token_type: Option<String>,
}

/// `expires_in` as the v2 endpoint sends it (a number) or the v1 one (a string).
#[derive(Deserialize)]
#[serde(untagged)]
enum Seconds {
    Whole(u64),
    Fraction(f64),
    Text(String),
}

impl Seconds {
    /// A lifetime from any number, saturating: a negative one (a `Fraction`) is no lifetime
    /// and a huge one the longest there is; the cache bounds both.
    fn lifetime(&self) -> Result<Duration, TokenError> {
        match self {
            Self::Whole(seconds) => Ok(Duration::from_secs(*seconds)),
            Self::Fraction(seconds) => Ok(Duration::try_from_secs_f64(*seconds).unwrap_or(
                if *seconds > 0.0 {
                    Duration::MAX
                } else {
                    Duration::ZERO
                },
            )),
            Self::Text(text) => {
                let text = text.trim();
                if let Ok(seconds) = text.parse::<u64>() {
                    Ok(Duration::from_secs(seconds))
                } else if let Ok(seconds) = text.parse::<f64>()
                    && !seconds.is_nan()
                {
                    Self::Fraction(seconds).lifetime()
                } else {
                    Err(TokenError::Malformed(
                        "expires_in is not a number of seconds".into(),
                    ))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        collections::HashMap,
        convert::Infallible,
        sync::{Arc, Mutex},
    };

    use axum::{
        Form, Router,
        body::Body,
        extract::{Path, State},
        http::HeaderMap,
        response::IntoResponse,
        routing::post,
    };
    use bytes::Bytes;

    use super::*;
    use crate::provider::token::TokenCache;
    use reqwest::StatusCode;

    const SECRET: &str = "s3cr&t=+/ é%";

    /// What the token endpoint received: the tenant in the path, the content
    /// type and the form.
    type Seen = Arc<Mutex<Vec<(String, String, HashMap<String, String>)>>>;

    /// A token endpoint on 127.0.0.1:0 that records each request and answers
    /// `status` and `body`.
    async fn endpoint(status: StatusCode, body: impl Into<String>) -> (String, Seen) {
        let body: String = body.into();
        let seen = Seen::default();
        let router = Router::new()
            .route(
                "/{tenant}/oauth2/v2.0/token",
                post(
                    move |State(seen): State<Seen>,
                          Path(tenant): Path<String>,
                          headers: HeaderMap,
                          Form(form): Form<HashMap<String, String>>| {
                        let body = body.clone();
                        async move {
                            let content_type = headers
                                .get(http::header::CONTENT_TYPE)
                                .map(|v| v.to_str().unwrap().to_owned())
                                .unwrap_or_default();
                            seen.lock().unwrap().push((tenant, content_type, form));
                            (
                                status,
                                [(http::header::CONTENT_TYPE, "application/json")],
                                body,
                            )
                        }
                    },
                ),
            )
            .with_state(Arc::clone(&seen));
        (serve(router).await, seen)
    }

    async fn serve(router: Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await });
        url
    }

    fn grant(authority: &str, client: reqwest::Client) -> EntraGrant {
        EntraGrant::new(
            authority,
            "tenant-1",
            "client-1",
            Secret::new(SECRET.into()),
            client,
        )
        .unwrap()
    }

    /// The grant's answer, bounded so a broken test fails instead of hanging.
    async fn issue(grant: &EntraGrant) -> Result<Issued, TokenError> {
        tokio::time::timeout(Duration::from_secs(10), grant.issue())
            .await
            .expect("the grant answered in time")
    }

    #[tokio::test]
    async fn posts_the_client_credentials_form_to_the_tenants_token_path() {
        let (url, seen) = endpoint(
            StatusCode::OK,
            r#"{"token_type":"Bearer","expires_in":3599,"ext_expires_in":3599,"access_token":"tok-abc"}"#,
        )
        .await;
        // A trailing slash on the authority is not doubled into the path.
        let issued = issue(&grant(&format!("{url}/"), reqwest::Client::new()))
            .await
            .unwrap();
        assert_eq!(issued.token.expose(), "tok-abc");
        assert_eq!(issued.lifetime, Duration::from_secs(3599));

        let seen = seen.lock().unwrap();
        let [(tenant, content_type, form)] = seen.as_slice() else {
            panic!("one request, not {}", seen.len());
        };
        assert_eq!(tenant, "tenant-1");
        assert_eq!(content_type, "application/x-www-form-urlencoded");
        let expected: HashMap<String, String> = [
            ("grant_type", "client_credentials"),
            ("client_id", "client-1"),
            ("client_secret", SECRET),
            ("scope", COGNITIVE_SERVICES_SCOPE),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(*form, expected, "every field, percent-decoded as sent");
    }

    #[tokio::test]
    async fn another_scope_is_asked_for_when_told() {
        let (url, seen) = endpoint(
            StatusCode::OK,
            r#"{"token_type":"Bearer","expires_in":60,"access_token":"t"}"#,
        )
        .await;
        let grant = grant(&url, reqwest::Client::new()).with_scope("api://other/.default");
        issue(&grant).await.unwrap();
        assert_eq!(seen.lock().unwrap()[0].2["scope"], "api://other/.default");
    }

    #[tokio::test]
    async fn expires_in_is_a_number_or_a_string_and_never_panics() {
        for (expires_in, lifetime) in [
            ("3599", Duration::from_secs(3599)),
            ("\"3599\"", Duration::from_secs(3599)),
            ("\" 60 \"", Duration::from_secs(60)),
            ("0", Duration::ZERO),
            ("-5", Duration::ZERO),
            ("\"-5\"", Duration::ZERO),
            ("1.5", Duration::from_millis(1500)),
            ("1e30", Duration::MAX),
            ("18446744073709551616", Duration::MAX),
        ] {
            let body = format!(
                r#"{{"token_type":"Bearer","expires_in":{expires_in},"access_token":"tok"}}"#
            );
            let (url, _) = endpoint(StatusCode::OK, body).await;
            let issued = issue(&grant(&url, reqwest::Client::new())).await;
            assert_eq!(
                issued.unwrap().lifetime,
                lifetime,
                "expires_in {expires_in}"
            );
        }
    }

    #[tokio::test]
    async fn an_answer_that_is_no_token_is_malformed_without_quoting_it() {
        for body in [
            r#"{"token_type":"Bearer","expires_in":"soon","access_token":"tok-leak"}"#,
            r#"{"token_type":"Bearer","access_token":"tok-leak"}"#,
            r#"{"token_type":"pop","expires_in":60,"access_token":"tok-leak"}"#,
            r#"{"token_type":"Bearer","expires_in":60,"access_token":["tok-leak"]}"#,
            "tok-leak",
        ] {
            let (url, _) = endpoint(StatusCode::OK, body).await;
            let error = issue(&grant(&url, reqwest::Client::new()))
                .await
                .unwrap_err();
            assert!(
                matches!(error, TokenError::Malformed(_)),
                "{body}: {error:?}"
            );
            assert!(!error.to_string().contains("tok-leak"), "{error}");
        }
    }

    #[tokio::test]
    async fn invalid_client_is_refused_with_entras_code_and_a_clipped_description() {
        let description = format!(
            "AADSTS7000215: Invalid client secret provided. {}\r\nTrace ID: 0000",
            "x".repeat(1000)
        );
        let body = serde_json::json!({
            "error": "invalid_client",
            "error_description": description,
            "error_codes": [7000215],
        })
        .to_string();
        let (url, _) = endpoint(StatusCode::UNAUTHORIZED, body).await;
        let error = issue(&grant(&url, reqwest::Client::new()))
            .await
            .unwrap_err();
        let TokenError::Refused { status, reason } = &error else {
            panic!("refused, not {error:?}");
        };
        assert_eq!(*status, StatusCode::UNAUTHORIZED);
        assert!(
            reason.starts_with("invalid_client: AADSTS7000215: Invalid client secret"),
            "{reason}"
        );
        assert!(
            reason.chars().count() <= "invalid_client: ".len() + 201,
            "{reason}"
        );
        assert!(
            !reason.contains('\n') && !reason.contains("Trace ID"),
            "{reason}"
        );
        assert!(!format!("{error} {error:?}").contains(SECRET));
    }

    #[tokio::test]
    async fn a_refusal_without_entras_json_says_the_status() {
        let (url, _) = endpoint(StatusCode::SERVICE_UNAVAILABLE, "<html>down</html>").await;
        let error = issue(&grant(&url, reqwest::Client::new()))
            .await
            .unwrap_err();
        assert_eq!(
            error,
            TokenError::Refused {
                status: StatusCode::SERVICE_UNAVAILABLE,
                reason: "Service Unavailable".into()
            }
        );
    }

    #[tokio::test]
    async fn an_oversized_answer_is_refused_without_reading_it_whole() {
        let declared = Router::new().route(
            "/{tenant}/oauth2/v2.0/token",
            post(|| async { " ".repeat(MAX_ANSWER_BYTES + 1) }),
        );
        let url = serve(declared).await;
        let error = issue(&grant(&url, reqwest::Client::new()))
            .await
            .unwrap_err();
        assert_eq!(
            error,
            TokenError::TooLarge {
                limit: MAX_ANSWER_BYTES
            }
        );

        // No length given and no end: reading stops at the bound.
        let endless = Router::new().route(
            "/{tenant}/oauth2/v2.0/token",
            post(|| async {
                Body::from_stream(futures::stream::repeat_with(|| {
                    Ok::<_, Infallible>(Bytes::from_static(&[b' '; 8192]))
                }))
                .into_response()
            }),
        );
        let url = serve(endless).await;
        let error = issue(&grant(&url, reqwest::Client::new()))
            .await
            .unwrap_err();
        assert_eq!(
            error,
            TokenError::TooLarge {
                limit: MAX_ANSWER_BYTES
            }
        );
    }

    #[tokio::test]
    async fn a_silent_token_endpoint_times_out() {
        let silent = Router::new().route(
            "/{tenant}/oauth2/v2.0/token",
            post(std::future::pending::<&'static str>),
        );
        let url = serve(silent).await;
        let client = reqwest::Client::builder()
            .timeout(Duration::from_millis(200))
            .build()
            .unwrap();
        assert_eq!(
            issue(&grant(&url, client)).await.unwrap_err(),
            TokenError::Timeout
        );
    }

    #[tokio::test]
    async fn an_unreachable_endpoint_is_unreachable() {
        // A port just released: nothing listens there any more.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let error = issue(&grant(&url, reqwest::Client::new()))
            .await
            .unwrap_err();
        assert!(matches!(error, TokenError::Unreachable(_)), "{error:?}");
    }

    #[tokio::test]
    async fn the_cache_hands_out_entras_token_as_a_bearer() {
        let (url, seen) = endpoint(
            StatusCode::OK,
            r#"{"token_type":"Bearer","expires_in":3599,"access_token":"tok-abc"}"#,
        )
        .await;
        let cache = TokenCache::new(Box::new(grant(&url, reqwest::Client::new())));
        for _ in 0..3 {
            assert_eq!(cache.bearer().await.unwrap(), "Bearer tok-abc");
        }
        assert_eq!(seen.lock().unwrap().len(), 1);
        let printed = format!("{cache:?}");
        assert!(
            !printed.contains(SECRET) && !printed.contains("tok-abc"),
            "{printed}"
        );
    }

    #[test]
    fn new_refuses_what_would_not_name_a_tenants_token_endpoint() {
        let client = reqwest::Client::new();
        let secret = || Secret::new("s".to_owned());
        let authority = "https://login.microsoftonline.com";
        for tenant in ["", "..", "a/b", "a?b", "a#b", "a b"] {
            assert!(
                EntraGrant::new(authority, tenant, "c", secret(), client.clone()).is_err(),
                "tenant {tenant:?}"
            );
        }
        for authority in ["not a url", "ftp://host", "https://host/?q=1"] {
            assert!(
                EntraGrant::new(authority, "t", "c", secret(), client.clone()).is_err(),
                "authority {authority:?}"
            );
        }
        assert!(EntraGrant::new(authority, "t", " ", secret(), client.clone()).is_err());
        assert!(EntraGrant::new(authority, "t", "c", Secret::default(), client.clone()).is_err());
        let grant =
            EntraGrant::new(authority, "contoso.onmicrosoft.com", "c", secret(), client).unwrap();
        assert_eq!(
            grant.token_url.as_str(),
            "https://login.microsoftonline.com/contoso.onmicrosoft.com/oauth2/v2.0/token"
        );
    }
}
