//! What every OAuth token endpoint's answer asks of its reader (Entra ID's,
//! Google's): a body read within a bound, a transport error without its
//! URL, and a refusal (RFC 6749 `error`, `error_description`) named in a
//! short line that quotes nothing else of the answer.

use reqwest::{StatusCode, Url};
use serde::{Deserialize, de::DeserializeOwned};

use super::token::TokenError;

/// The most of a token endpoint's answer that is read: a token answer is a
/// few kilobytes.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// Characters of an endpoint's `error_description` kept in an error.
const MAX_DESCRIPTION_CHARS: usize = 200;

/// Characters of an endpoint's `error` code kept in an error.
const MAX_CODE_CHARS: usize = 64;

/// Posts `form` to the token endpoint at `url` and reads its answer as `T`:
/// a 2xx body within [`MAX_ANSWER_BYTES`], a refusal as `Refused` with the
/// endpoint's own code, an answer that is no `T` as `Malformed` without a
/// word of it.
pub(super) async fn post_form<T: DeserializeOwned>(
    client: &reqwest::Client,
    url: Url,
    form: &[(&str, &str)],
) -> Result<T, TokenError> {
    let mut response = client
        .post(url)
        .header(http::header::ACCEPT, "application/json")
        .form(form)
        .send()
        .await
        .map_err(transport_error)?;
    let status = response.status();
    let body = read_bounded(&mut response).await?;
    if !status.is_success() {
        return Err(TokenError::Refused {
            status,
            reason: refusal_reason(status, &body),
        });
    }
    serde_json::from_slice(&body).map_err(|error| {
        // serde's own text may quote a value from the answer; only where it failed is kept.
        TokenError::Malformed(format!(
            "not a token answer (line {}, column {})",
            error.line(),
            error.column()
        ))
    })
}

pub(super) fn transport_error(error: reqwest::Error) -> TokenError {
    if error.is_timeout() {
        TokenError::Timeout
    } else {
        // Without the URL: it names nothing secret, but the error stays short.
        TokenError::Unreachable(error.without_url().to_string())
    }
}

/// The answer's body, at most [`MAX_ANSWER_BYTES`]; a longer one is refused
/// as soon as it shows itself, without reading the rest.
async fn read_bounded(response: &mut reqwest::Response) -> Result<Vec<u8>, TokenError> {
    let too_large = TokenError::TooLarge {
        limit: MAX_ANSWER_BYTES,
    };
    if response
        .content_length()
        .is_some_and(|length| length > MAX_ANSWER_BYTES as u64)
    {
        return Err(too_large);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(transport_error)? {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(too_large);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The endpoint's error code and the start of its description, or the status's own
/// words when the body is not Entra's error JSON.
fn refusal_reason(status: StatusCode, body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Refusal {
        error: String,
        error_description: Option<String>,
    }
    match serde_json::from_slice::<Refusal>(body) {
        Ok(refusal) => {
            let code = clip(&refusal.error, MAX_CODE_CHARS);
            match refusal.error_description {
                Some(description) if !description.trim().is_empty() => {
                    format!("{code}: {}", clip(&description, MAX_DESCRIPTION_CHARS))
                }
                _ => code,
            }
        }
        Err(_) => status
            .canonical_reason()
            .unwrap_or("no reason given")
            .to_owned(),
    }
}

/// A token answer's `token_type`, when it says one, must be a bearer's:
/// corral sends every token as `Authorization: Bearer`.
pub(super) fn bearer_only(token_type: Option<&str>) -> Result<(), TokenError> {
    match token_type {
        Some(kind) if !kind.eq_ignore_ascii_case("bearer") => Err(TokenError::Malformed(format!(
            "a {:?} token, not a bearer token",
            clip(kind, MAX_CODE_CHARS)
        ))),
        _ => Ok(()),
    }
}

/// At most `max` characters of `text` on one line (Entra's descriptions carry
/// `\r\n` before their trace ids), with an ellipsis when cut.
fn clip(text: &str, max: usize) -> String {
    let one_line = |c: char| if c.is_control() { ' ' } else { c };
    let text = text.trim();
    let mut clipped: String = text.chars().take(max).map(one_line).collect();
    if text.chars().nth(max).is_some() {
        clipped.push('…');
    }
    clipped
}
