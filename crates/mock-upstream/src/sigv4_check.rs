//! Checking an AWS Signature Version 4 the way an AWS service does: the request is signed again
//! with the secret the mock knows, over the exact bytes received, and the two signatures must
//! be equal.
//!
//! The signing itself is `aws-sigv4`'s, the signer the AWS SDKs use, fed with exactly the headers
//! the client says it signed (`SignedHeaders`): a client signs what it sends at signing time, and
//! a transport may add headers afterwards (`content-length`, `accept-encoding`) that are not part
//! of the signature. What this module adds is only what the signer cannot know: that the
//! credential scope names the expected key, date, region and service, that `x-amz-date` is within
//! AWS's fifteen minutes of now, that a session token was sent when the credentials have one, and
//! that `x-amz-content-sha256`, when sent, is the body's digest.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SessionTokenMode, SignableBody, SignableRequest,
    SigningSettings, UriPathNormalizationMode, sign,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use aws_smithy_types::date_time::{DateTime, Format};
use axum::http::request::Parts;
use sha2::{Digest as _, Sha256};

/// The only algorithm a SigV4 `Authorization` header may name.
const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// How far `x-amz-date` may be from the server's clock, either way, as AWS allows.
pub(crate) const MAX_CLOCK_SKEW: Duration = Duration::from_secs(15 * 60);

/// The credentials and scope a signature must have been made with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Expected<'a> {
    pub(crate) access_key_id: &'a str,
    pub(crate) secret_access_key: &'a str,
    pub(crate) session_token: Option<&'a str>,
    pub(crate) region: &'a str,
    pub(crate) service: &'a str,
}

/// Why a request's signature was refused, each worded as AWS words it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SigV4Error {
    #[error("Missing Authentication Token")]
    MissingAuthentication,
    #[error("{0}")]
    Incomplete(String),
    #[error("The security token included in the request is invalid.")]
    UnrecognizedClient,
    #[error("{0}")]
    WrongScope(String),
    #[error("Signature expired: {signed} is now earlier than {earliest} ({now} - 15 min.)")]
    Expired {
        signed: String,
        earliest: String,
        now: String,
    },
    #[error("Signature not yet current: {signed} is still later than {latest} ({now} + 15 min.)")]
    NotYetCurrent {
        signed: String,
        latest: String,
        now: String,
    },
    #[error("The provided 'x-amz-content-sha256' header does not match what was computed.")]
    ContentHashMismatch,
    #[error(
        "The request signature we calculated does not match the signature you provided. Check \
         your AWS Secret Access Key and signing method. Consult the service documentation for \
         details."
    )]
    SignatureMismatch,
}

impl SigV4Error {
    /// The `x-amzn-ErrorType` AWS answers this refusal with (always with status 403).
    pub(crate) fn error_type(&self) -> &'static str {
        match self {
            Self::MissingAuthentication => "MissingAuthenticationTokenException",
            Self::Incomplete(_) => "IncompleteSignatureException",
            Self::UnrecognizedClient => "UnrecognizedClientException",
            Self::WrongScope(_)
            | Self::Expired { .. }
            | Self::NotYetCurrent { .. }
            | Self::ContentHashMismatch
            | Self::SignatureMismatch => "InvalidSignatureException",
        }
    }
}

/// The parts of `Authorization: AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=...`.
#[derive(Debug, PartialEq, Eq)]
struct Authorization<'a> {
    access_key_id: &'a str,
    date: &'a str,
    region: &'a str,
    service: &'a str,
    signed_headers: Vec<&'a str>,
    signature: &'a str,
}

impl<'a> Authorization<'a> {
    fn parse(value: &'a str) -> Result<Self, SigV4Error> {
        let incomplete = |what: &str| {
            SigV4Error::Incomplete(format!(
                "Authorization header requires '{what}' parameter. Authorization={value}"
            ))
        };
        let rest = value
            .strip_prefix(ALGORITHM)
            .and_then(|rest| rest.strip_prefix(' '))
            .ok_or_else(|| {
                SigV4Error::Incomplete(format!(
                    "Authorization header must use the {ALGORITHM} algorithm. Authorization={value}"
                ))
            })?;
        let (mut credential, mut signed_headers, mut signature) = (None, None, None);
        for part in rest.split(',') {
            match part.trim().split_once('=') {
                Some(("Credential", v)) => credential = Some(v),
                Some(("SignedHeaders", v)) => signed_headers = Some(v),
                Some(("Signature", v)) => signature = Some(v),
                _ => {}
            }
        }
        let credential = credential.ok_or_else(|| incomplete("Credential"))?;
        let signed_headers = signed_headers.ok_or_else(|| incomplete("SignedHeaders"))?;
        let signature = signature.ok_or_else(|| incomplete("Signature"))?;
        let scope: Vec<&str> = credential.split('/').collect();
        let [access_key_id, date, region, service, "aws4_request"] = scope[..] else {
            return Err(SigV4Error::Incomplete(format!(
                "Credential should be scoped to a valid region, service and aws4_request. \
                 Credential={credential}"
            )));
        };
        Ok(Self {
            access_key_id,
            date,
            region,
            service,
            signed_headers: signed_headers.split(';').collect(),
            signature,
        })
    }
}

/// Check the SigV4 signature of a request whose body is `body`, as received at `now`.
pub(crate) fn verify(
    expected: &Expected<'_>,
    parts: &Parts,
    body: &[u8],
    now: SystemTime,
) -> Result<(), SigV4Error> {
    let headers = &parts.headers;
    let authorization = headers
        .get("authorization")
        .ok_or(SigV4Error::MissingAuthentication)?
        .to_str()
        .map_err(|_| SigV4Error::Incomplete("The Authorization header is not ASCII.".into()))?;
    let authorization = Authorization::parse(authorization)?;
    if authorization.access_key_id != expected.access_key_id {
        return Err(SigV4Error::UnrecognizedClient);
    }
    let token = headers
        .get("x-amz-security-token")
        .and_then(|v| v.to_str().ok());
    if token != expected.session_token {
        return Err(SigV4Error::UnrecognizedClient);
    }
    let signed_at = header(parts, "x-amz-date").ok_or_else(|| {
        SigV4Error::Incomplete(
            "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header."
                .into(),
        )
    })?;
    check_scope(expected, &authorization, signed_at)?;
    let time = check_clock(signed_at, now)?;
    if !authorization.signed_headers.contains(&"host") {
        return Err(SigV4Error::SignatureMismatch);
    }
    let digest = hex::encode(Sha256::digest(body));
    if let Some(sent) = header(parts, "x-amz-content-sha256")
        && sent != digest
    {
        return Err(SigV4Error::ContentHashMismatch);
    }

    let signature = resign(expected, &authorization, parts, body, time)?;
    if signature == authorization.signature {
        Ok(())
    } else {
        Err(SigV4Error::SignatureMismatch)
    }
}

/// The signature `aws-sigv4` makes of this request, over the headers the client says it signed.
fn resign(
    expected: &Expected<'_>,
    authorization: &Authorization<'_>,
    parts: &Parts,
    body: &[u8],
    time: SystemTime,
) -> Result<String, SigV4Error> {
    let mut signed = Vec::new();
    for name in &authorization.signed_headers {
        for value in parts.headers.get_all(*name) {
            let value = value.to_str().map_err(|_| SigV4Error::SignatureMismatch)?;
            signed.push((*name, value));
        }
    }
    let uri = parts
        .uri
        .path_and_query()
        .map_or("/", |target| target.as_str());
    let request = SignableRequest::new(
        parts.method.as_str(),
        uri,
        signed.into_iter(),
        SignableBody::Bytes(body),
    )
    .map_err(|_| SigV4Error::SignatureMismatch)?;

    let mut settings = SigningSettings::default();
    // Exactly the headers passed are signed: the client's list is the truth, not a default.
    settings.excluded_headers = Some(Vec::<Cow<'static, str>>::new());
    settings.payload_checksum_kind = if authorization
        .signed_headers
        .contains(&"x-amz-content-sha256")
    {
        PayloadChecksumKind::XAmzSha256
    } else {
        PayloadChecksumKind::NoHeader
    };
    settings.session_token_mode = SessionTokenMode::Include;
    // Every AWS service but S3 encodes the already encoded path once more.
    settings.percent_encoding_mode = PercentEncodingMode::Double;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Enabled;
    let identity: Identity = Credentials::new(
        expected.access_key_id,
        expected.secret_access_key,
        expected.session_token.map(str::to_owned),
        None,
        "mock-upstream",
    )
    .into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(expected.region)
        .name(expected.service)
        .time(time)
        .settings(settings)
        .build()
        .map_err(|_| SigV4Error::SignatureMismatch)?
        .into();
    let output = sign(request, &params).map_err(|_| SigV4Error::SignatureMismatch)?;
    Ok(output.signature().to_owned())
}

fn header<'a>(parts: &'a Parts, name: &str) -> Option<&'a str> {
    parts.headers.get(name).and_then(|v| v.to_str().ok())
}

/// The credential scope must be the request's own day, the expected region and service.
fn check_scope(
    expected: &Expected<'_>,
    authorization: &Authorization<'_>,
    signed_at: &str,
) -> Result<(), SigV4Error> {
    if !signed_at.starts_with(authorization.date) || authorization.date.len() != 8 {
        return Err(SigV4Error::WrongScope(format!(
            "Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date from \
             HTTP: '{}' != '{}', from '{signed_at}'.",
            authorization.date,
            signed_at.get(..8).unwrap_or(signed_at),
        )));
    }
    if authorization.region != expected.region {
        return Err(SigV4Error::WrongScope(format!(
            "Credential should be scoped to a valid region. '{}' is not '{}'.",
            authorization.region, expected.region
        )));
    }
    if authorization.service != expected.service {
        return Err(SigV4Error::WrongScope(format!(
            "Credential should be scoped to correct service: '{}'. ",
            expected.service
        )));
    }
    Ok(())
}

/// The signing time `x-amz-date` (`YYYYMMDDTHHMMSSZ`) names, if it is within the allowed skew.
fn check_clock(signed_at: &str, now: SystemTime) -> Result<SystemTime, SigV4Error> {
    let time = parse_amz_date(signed_at).ok_or_else(|| {
        SigV4Error::Incomplete(format!(
            "Date must be in ISO-8601 'basic format'. Got '{signed_at}'. See \
             http://en.wikipedia.org/wiki/ISO_8601"
        ))
    })?;
    if time + MAX_CLOCK_SKEW < now {
        return Err(SigV4Error::Expired {
            signed: signed_at.to_owned(),
            earliest: amz_date(now - MAX_CLOCK_SKEW),
            now: amz_date(now),
        });
    }
    if time > now + MAX_CLOCK_SKEW {
        return Err(SigV4Error::NotYetCurrent {
            signed: signed_at.to_owned(),
            latest: amz_date(now + MAX_CLOCK_SKEW),
            now: amz_date(now),
        });
    }
    Ok(time)
}

/// `YYYYMMDDTHHMMSSZ` as a time, read by `aws-smithy-types` once put in RFC 3339's dashes.
fn parse_amz_date(value: &str) -> Option<SystemTime> {
    let bytes = value.as_bytes();
    let shaped = bytes.len() == 16
        && bytes[8] == b'T'
        && bytes[15] == b'Z'
        && bytes[..8]
            .iter()
            .chain(&bytes[9..15])
            .all(u8::is_ascii_digit);
    if !shaped {
        return None;
    }
    let rfc3339 = format!(
        "{}-{}-{}T{}:{}:{}Z",
        &value[0..4],
        &value[4..6],
        &value[6..8],
        &value[9..11],
        &value[11..13],
        &value[13..15]
    );
    let time = DateTime::from_str(&rfc3339, Format::DateTime).ok()?;
    SystemTime::try_from(time).ok()
}

/// A time as `x-amz-date` writes it.
pub(crate) fn amz_date(time: SystemTime) -> String {
    let rfc3339 = DateTime::from(time)
        .fmt(Format::DateTime)
        .unwrap_or_default();
    // `2025-01-02T03:04:05Z` or with fractional seconds: keep the digits up to the seconds.
    let digits: String = rfc3339
        .chars()
        .take(19)
        .filter(char::is_ascii_digit)
        .collect();
    match digits.get(..8).zip(digits.get(8..)) {
        Some((day, clock)) => format!("{day}T{clock}Z"),
        None => String::new(),
    }
}

#[cfg(test)]
#[path = "sigv4_check_tests.rs"]
pub(crate) mod tests;
