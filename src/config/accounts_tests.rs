//! The providers' accounts (Azure, Bedrock, Vertex AI) as the config checks them.

use super::Config;

/// The clouds' accounts: each setting on the provider that reads it, one
/// credential an account, and a missing region or key file stops the start
/// with one line naming the key.
#[test]
fn cloud_accounts_are_checked_at_start_with_one_line_each() {
    let anthropic = |member: &str| {
        format!(
            "listen: 127.0.0.1:0\nupstreams:\n  - name: claude\n    api: anthropic\n    base_url: http://127.0.0.1:9/v1\n    models: ['claude-*']\n    members:\n      - {member}\n"
        )
    };
    let env = [
        ("AWS_ID", "AKIDEXAMPLE"),
        ("AWS_SECRET", "secret"),
        ("BEDROCK_KEY", "ABSK-key"),
        ("SA_JSON", "{}"),
        ("AZ_KEY", "az"),
        ("AZ_SECRET", "entra"),
    ];
    let aws = "aws: {access_key_id_env: AWS_ID, secret_access_key_env: AWS_SECRET}";
    let good = Config::load(
        &anthropic(&format!(
            "{{name: b, provider: bedrock, base_url: 'https://bedrock-runtime.us-east-1.amazonaws.com', region: us-east-1, {aws}, deployments: {{claude-sonnet-4-5: 'us.anthropic.claude-sonnet-4-5-20250929-v1:0'}}}}"
        )),
        env,
    )
    .unwrap();
    let member = &good.upstreams[0].effective_members()[0];
    assert!(member.has_own_credential());
    assert_eq!(
        member.aws.as_ref().unwrap().access_key_id.expose(),
        "AKIDEXAMPLE"
    );
    assert_eq!(
        member.deployment("claude-sonnet-4-5"),
        "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
    );
    for (member, key, says) in [
        (
            format!("{{name: b, provider: bedrock, base_url: 'https://x.amazonaws.com', {aws}}}"),
            "upstreams[0].members[0].region",
            "region",
        ),
        (
            format!("{{name: b, provider: bedrock, base_url: 'https://x.amazonaws.com', region: us-east-1, api_key_env: BEDROCK_KEY, {aws}}}"),
            "upstreams[0].members[0].aws",
            "exactly one",
        ),
        (
            "{name: v, provider: vertex, base_url: 'https://x.googleapis.com/v1/projects/p/locations/l', credentials_file: /nonexistent/sa.json}".to_owned(),
            "upstreams[0].members[0].credentials_file",
            "cannot read /nonexistent/sa.json",
        ),
        (
            "{name: v, provider: vertex, base_url: 'https://x.googleapis.com/v1/projects/p/locations/l'}".to_owned(),
            "upstreams[0].members[0].credentials_file",
            "service account",
        ),
        (
            "{name: a, provider: anthropic, region: us-east-1, api_key_env: AZ_KEY}".to_owned(),
            "upstreams[0].members[0].region",
            "Bedrock",
        ),
        (
            "{name: a, provider: azure, api_key_env: AZ_KEY}".to_owned(),
            "upstreams[0].members[0].provider",
            "does not speak",
        ),
    ] {
        let err = Config::load(&anthropic(&member), env)
            .unwrap_err()
            .to_string();
        assert!(err.contains(key) && err.contains(says), "{member}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
    }
    // Azure: a key and an Entra application are two credentials for one account.
    let azure = "listen: 127.0.0.1:0\nupstreams:\n  - name: gpt\n    provider: azure\n    base_url: https://r.openai.azure.com/openai/v1\n    api_key_env: AZ_KEY\n    entra: {tenant_id: t, client_id: c, client_secret_env: AZ_SECRET}\n";
    let err = Config::load(azure, env).unwrap_err().to_string();
    assert!(err.contains("upstreams[0].entra"), "{err}");
}
