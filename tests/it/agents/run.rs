//! Running a client: a clean environment, a bound on its time (the child is killed past it, and
//! whenever the test drops it), and what it printed. Also the JSON-path difference of two
//! request bodies, which is what a failing coalescing test has to say.

use std::{
    ffi::OsStr,
    io::ErrorKind,
    path::Path,
    process::{ExitStatus, Stdio},
    time::Duration,
};

use serde_json::Value;
use tokio::process::Command;

/// What a finished client printed, and how it exited.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// `self`, if the client exited 0; otherwise the test fails with everything it printed.
    pub fn success(self, what: &str) -> Self {
        assert!(
            self.status.success(),
            "{what} failed ({}):\nstdout: {}\nstderr: {}",
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }

    /// The last non-empty line of stdout parsed as JSON (the scripts' results).
    pub fn json(&self) -> Value {
        self.stdout
            .lines()
            .rev()
            .find(|line| !line.trim().is_empty())
            .and_then(|line| serde_json::from_str(line).ok())
            .unwrap_or_else(|| {
                panic!(
                    "no JSON line on stdout: {}\nstderr: {}",
                    self.stdout, self.stderr
                )
            })
    }
}

/// `program` with none of the caller's environment but PATH (no provider key, base URL or
/// proxy of the developer's leaks into a client), its HOME in the test's own directory, so no
/// client reads or writes the user's configuration.
pub fn clean_command(program: impl AsRef<OsStr>, home: &Path) -> Command {
    let mut command = Command::new(program);
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("LANG", "C.UTF-8")
        .env("TMPDIR", home);
    command
}

/// Runs `command` to completion within `timeout`; past it the child is killed (by
/// `kill_on_drop`) and the test fails. stdin is empty, as in CI.
pub async fn run(mut command: Command, timeout: Duration, what: &str) -> Finished {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = command.spawn().unwrap_or_else(|err| {
        let program = command
            .as_std()
            .get_program()
            .to_string_lossy()
            .into_owned();
        if err.kind() == ErrorKind::NotFound {
            panic!("{what}: {program} is not installed (not on PATH, or not where it should be)")
        }
        panic!("starting {what} ({program}): {err}")
    });
    let output = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {timeout:?}"))
        .unwrap_or_else(|err| panic!("waiting for {what}: {err}"));
    Finished {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Where `a` and `b` differ: each JSON path (`$.input[0].id`) with both values, shortened.
/// Arrays are compared index by index, and a length difference is a path of its own.
pub fn differences(a: &Value, b: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    walk(a, b, "$".to_owned(), &mut out);
    out
}

fn walk(a: &Value, b: &Value, path: String, out: &mut Vec<(String, String)>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                let path = format!("{path}.{key}");
                match (x.get(key), y.get(key)) {
                    (Some(x), Some(y)) => walk(x, y, path, out),
                    (x, y) => out.push((path, format!("{} vs {}", shown(x), shown(y)))),
                }
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            if x.len() != y.len() {
                out.push((
                    format!("{path}.length"),
                    format!("{} vs {}", x.len(), y.len()),
                ));
            }
            for (i, (x, y)) in x.iter().zip(y).enumerate() {
                walk(x, y, format!("{path}[{i}]"), out);
            }
        }
        (x, y) if x != y => out.push((path, format!("{} vs {}", shown(Some(x)), shown(Some(y))))),
        _ => {}
    }
}

fn shown(value: Option<&Value>) -> String {
    const MAX: usize = 80;
    let Some(value) = value else {
        return "(absent)".to_owned();
    };
    let text = value.to_string();
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}
