//! The signature check against AWS's published test vectors (so it cannot merely agree with
//! the signer that made the signature) and against signatures made by `aws-sigv4` the way an
//! AWS SDK makes them, then tampered with one way at a time.

use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use axum::http::Request;
use axum::http::request::Parts;

use super::{Expected, SigV4Error, amz_date, parse_amz_date, verify};

/// The credentials of AWS's SigV4 test suite.
const SUITE: Expected<'static> = Expected {
    access_key_id: "AKIDEXAMPLE",
    secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
    session_token: None,
    region: "us-east-1",
    service: "service",
};

const BEDROCK: Expected<'static> = Expected {
    access_key_id: "AKIAIOSFODNN7EXAMPLE",
    secret_access_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    session_token: None,
    region: "us-east-1",
    service: "bedrock",
};

const HOST: &str = "bedrock-runtime.us-east-1.amazonaws.com";
const PATH: &str = "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke";
const BODY: &[u8] = br#"{"anthropic_version":"bedrock-2023-05-31","max_tokens":8,"messages":[]}"#;

/// The headers an AWS SDK adds to sign a request (`authorization`, `x-amz-date`, and
/// `x-amz-security-token` for temporary credentials), made by `aws-sigv4` with its default
/// settings, as the Rust SDK signs.
pub(crate) fn signature_headers(
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    credentials: &Expected<'_>,
    time: SystemTime,
) -> Vec<(String, String)> {
    let identity: Identity = Credentials::new(
        credentials.access_key_id,
        credentials.secret_access_key,
        credentials.session_token.map(str::to_owned),
        None,
        "test",
    )
    .into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(credentials.region)
        .name(credentials.service)
        .time(time)
        .settings(SigningSettings::default())
        .build()
        .expect("signing parameters")
        .into();
    let request = SignableRequest::new(
        method,
        uri,
        headers.iter().copied(),
        SignableBody::Bytes(body),
    )
    .expect("a signable request");
    let (instructions, _) = sign(request, &params).expect("signing").into_parts();
    instructions
        .headers()
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

fn parts(method: &str, uri: &str, headers: &[(&str, &str)]) -> Parts {
    let mut request = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(()).expect("a request").into_parts().0
}

/// A Bedrock call signed at `time` with `credentials`, with any headers added after signing.
fn signed_call(credentials: &Expected<'_>, time: SystemTime, added: &[(&str, &str)]) -> Parts {
    let base = [("host", HOST), ("content-type", "application/json")];
    let url = format!("https://{HOST}{PATH}");
    let signature = signature_headers("POST", &url, &base, BODY, credentials, time);
    let mut headers: Vec<(&str, &str)> = base.to_vec();
    headers.extend(signature.iter().map(|(n, v)| (n.as_str(), v.as_str())));
    headers.extend_from_slice(added);
    parts("POST", PATH, &headers)
}

fn vanilla(uri: &str, signature: &str) -> Parts {
    let authorization = format!(
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
         SignedHeaders=host;x-amz-date, Signature={signature}"
    );
    parts(
        "GET",
        uri,
        &[
            ("host", "example.amazonaws.com"),
            ("x-amz-date", "20150830T123600Z"),
            ("authorization", &authorization),
        ],
    )
}

fn suite_time() -> SystemTime {
    parse_amz_date("20150830T123600Z").expect("the suite's date")
}

#[test]
fn aws_published_test_vectors_verify_and_a_changed_one_does_not() {
    let get_vanilla = "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31";
    assert_eq!(
        verify(&SUITE, &vanilla("/", get_vanilla), b"", suite_time()),
        Ok(())
    );
    let query_order = "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500";
    assert_eq!(
        verify(
            &SUITE,
            &vanilla("/?Param2=value2&Param1=value1", query_order),
            b"",
            suite_time()
        ),
        Ok(())
    );
    let changed = get_vanilla.replace('5', "6");
    assert_eq!(
        verify(&SUITE, &vanilla("/", &changed), b"", suite_time()),
        Err(SigV4Error::SignatureMismatch)
    );
    // The same signature over another path is another request.
    assert_eq!(
        verify(&SUITE, &vanilla("/other", get_vanilla), b"", suite_time()),
        Err(SigV4Error::SignatureMismatch)
    );
}

#[test]
fn an_sdk_signature_verifies_over_the_exact_body_and_headers_added_later_do_not_matter() {
    let now = SystemTime::now();
    let call = signed_call(&BEDROCK, now, &[("accept-encoding", "gzip")]);
    assert_eq!(verify(&BEDROCK, &call, BODY, now), Ok(()));

    let mut other_body = BODY.to_vec();
    other_body[3] ^= 1;
    assert_eq!(
        verify(&BEDROCK, &call, &other_body, now),
        Err(SigV4Error::SignatureMismatch)
    );
    let mut changed_header = call.clone();
    changed_header
        .headers
        .insert("content-type", "text/plain".parse().unwrap());
    assert_eq!(
        verify(&BEDROCK, &changed_header, BODY, now),
        Err(SigV4Error::SignatureMismatch)
    );
}

#[test]
fn another_secret_region_service_or_key_is_refused_for_what_it_is() {
    let now = SystemTime::now();
    let with =
        |changed: Expected<'static>| verify(&BEDROCK, &signed_call(&changed, now, &[]), BODY, now);
    assert_eq!(
        with(Expected {
            secret_access_key: "not-the-secret",
            ..BEDROCK
        }),
        Err(SigV4Error::SignatureMismatch)
    );
    assert!(matches!(
        with(Expected {
            region: "eu-west-1",
            ..BEDROCK
        }),
        Err(SigV4Error::WrongScope(message)) if message.contains("valid region")
    ));
    assert!(matches!(
        with(Expected {
            service: "s3",
            ..BEDROCK
        }),
        Err(SigV4Error::WrongScope(message)) if message.contains("'bedrock'")
    ));
    assert_eq!(
        with(Expected {
            access_key_id: "AKIAUNKNOWN000000000",
            ..BEDROCK
        }),
        Err(SigV4Error::UnrecognizedClient)
    );
}

#[test]
fn temporary_credentials_need_their_session_token() {
    let now = SystemTime::now();
    let temporary = Expected {
        session_token: Some("session-token"),
        ..BEDROCK
    };
    let with_token = signed_call(&temporary, now, &[]);
    assert_eq!(
        with_token.headers.get("x-amz-security-token").unwrap(),
        "session-token"
    );
    assert_eq!(verify(&temporary, &with_token, BODY, now), Ok(()));
    // Signed without the token the credentials have: AWS does not know who that is.
    let without = signed_call(&BEDROCK, now, &[]);
    assert_eq!(
        verify(&temporary, &without, BODY, now),
        Err(SigV4Error::UnrecognizedClient)
    );
}

#[test]
fn a_signature_is_good_for_fifteen_minutes_either_way() {
    let signed_at = SystemTime::now();
    let call = signed_call(&BEDROCK, signed_at, &[]);
    let minutes = |n: u64| Duration::from_secs(n * 60);
    assert_eq!(
        verify(&BEDROCK, &call, BODY, signed_at + minutes(14)),
        Ok(())
    );
    assert_eq!(
        verify(&BEDROCK, &call, BODY, signed_at - minutes(14)),
        Ok(())
    );
    assert!(matches!(
        verify(&BEDROCK, &call, BODY, signed_at + minutes(16)),
        Err(SigV4Error::Expired { .. })
    ));
    assert!(matches!(
        verify(&BEDROCK, &call, BODY, signed_at - minutes(16)),
        Err(SigV4Error::NotYetCurrent { .. })
    ));
}

#[test]
fn a_content_digest_that_is_not_the_bodys_is_refused() {
    let now = SystemTime::now();
    let wrong = "0".repeat(64);
    let call = signed_call(&BEDROCK, now, &[("x-amz-content-sha256", &wrong)]);
    assert_eq!(
        verify(&BEDROCK, &call, BODY, now),
        Err(SigV4Error::ContentHashMismatch)
    );
}

#[test]
fn requests_without_a_usable_authorization_are_named_as_aws_names_them() {
    let now = SystemTime::now();
    let bare = parts("POST", PATH, &[("host", HOST)]);
    let missing = verify(&BEDROCK, &bare, BODY, now).unwrap_err();
    assert_eq!(missing.error_type(), "MissingAuthenticationTokenException");
    assert_eq!(missing.to_string(), "Missing Authentication Token");

    let basic = parts(
        "POST",
        PATH,
        &[("host", HOST), ("authorization", "Basic abc")],
    );
    let incomplete = verify(&BEDROCK, &basic, BODY, now).unwrap_err();
    assert_eq!(incomplete.error_type(), "IncompleteSignatureException");

    let no_signature = parts(
        "POST",
        PATH,
        &[
            ("host", HOST),
            ("x-amz-date", &amz_date(now)),
            (
                "authorization",
                "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20250101/us-east-1/bedrock/aws4_request, SignedHeaders=host;x-amz-date",
            ),
        ],
    );
    assert!(matches!(
        verify(&BEDROCK, &no_signature, BODY, now),
        Err(SigV4Error::Incomplete(message)) if message.contains("'Signature'")
    ));

    assert_eq!(
        SigV4Error::SignatureMismatch.error_type(),
        "InvalidSignatureException"
    );
    assert!(
        SigV4Error::SignatureMismatch
            .to_string()
            .starts_with("The request signature we calculated does not match")
    );
    assert_eq!(
        SigV4Error::UnrecognizedClient.error_type(),
        "UnrecognizedClientException"
    );
}

#[test]
fn amz_dates_read_and_write_the_basic_iso_format() {
    let time = parse_amz_date("20250929T071502Z").expect("a valid date");
    assert_eq!(amz_date(time), "20250929T071502Z");
    for bad in [
        "2025-09-29T07:15:02Z",
        "20250929T071502",
        "20251329T071502Z",
        "",
    ] {
        assert_eq!(parse_amz_date(bad), None, "{bad}");
    }
}
