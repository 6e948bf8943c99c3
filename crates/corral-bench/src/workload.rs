//! What the load tool sends: requests drawn from `prompts/corpus.jsonl` by a
//! [`Mix`], with every body serialized before the clock starts where the mix
//! allows it (identical and Zipf), so the client spends its time on I/O.
//!
//! Every body carries the run's nonce in its text: a run starts cold (a
//! stampede needs a key nobody has cached) and two runs against one gateway
//! never share entries. The hit path warms its key explicitly.

use std::{fmt, path::Path, str::FromStr};

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use rand::Rng;
use rand_distr::{Distribution, Zipf};
use serde::Deserialize;
use serde_json::{Map, Value};

use corral::fingerprint::Endpoint;

/// One line of the corpus: an endpoint and a JSON body.
#[derive(Debug, Clone)]
pub struct Prompt {
    pub endpoint: Endpoint,
    pub body: Map<String, Value>,
}

/// Reads `corpus.jsonl` (one `{"endpoint", "body"}` per line, popularity rank order).
pub fn load_corpus(path: &Path) -> anyhow::Result<Vec<Prompt>> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Line {
        endpoint: String,
        body: Map<String, Value>,
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut prompts = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let line: Line = serde_json::from_str(line)
            .with_context(|| format!("{} line {}", path.display(), index + 1))?;
        let endpoint = match line.endpoint.as_str() {
            "chat" => Endpoint::ChatCompletions,
            "completions" => Endpoint::Completions,
            "embeddings" => Endpoint::Embeddings,
            other => bail!(
                "{} line {}: unknown endpoint {other:?}",
                path.display(),
                index + 1
            ),
        };
        prompts.push(Prompt {
            endpoint,
            body: line.body,
        });
    }
    ensure!(!prompts.is_empty(), "{} holds no prompt", path.display());
    Ok(prompts)
}

/// How requests are drawn from the corpus.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mix {
    /// The same request every time: corpus line `index` (0-based).
    Identical { index: usize },
    /// A different request every time (corpus lines in turn, each made unique).
    Distinct,
    /// Corpus line k (1-based rank) with weight 1 / k^s.
    Zipf { s: f64 },
}

impl FromStr for Mix {
    type Err = anyhow::Error;

    /// `identical`, `identical:N`, `distinct`, `zipf`, `zipf:S` (S > 0, default 1.1).
    fn from_str(text: &str) -> anyhow::Result<Self> {
        let (name, arg) = match text.split_once(':') {
            Some((name, arg)) => (name, Some(arg)),
            None => (text, None),
        };
        match (name, arg) {
            ("identical", None) => Ok(Self::Identical { index: 0 }),
            ("identical", Some(n)) => Ok(Self::Identical {
                index: n.parse().context("identical:N takes a corpus line index")?,
            }),
            ("distinct", None) => Ok(Self::Distinct),
            ("zipf", None) => Ok(Self::Zipf { s: 1.1 }),
            ("zipf", Some(s)) => {
                let s: f64 = s.parse().context("zipf:S takes a number")?;
                ensure!(s > 0.0 && s.is_finite(), "the Zipf exponent must be > 0");
                Ok(Self::Zipf { s })
            }
            _ => bail!("unknown mix {text:?}: identical[:N], distinct or zipf[:S]"),
        }
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Identical { index } => write!(f, "identical:{index}"),
            Self::Distinct => write!(f, "distinct"),
            Self::Zipf { s } => write!(f, "zipf:{s}"),
        }
    }
}

/// One request, ready to send: the path below the base URL and the body bytes.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub path: &'static str,
    pub body: Bytes,
    /// Which corpus line it came from.
    pub prompt: usize,
}

/// The request generator of one run.
pub struct Workload {
    prompts: Vec<Prompt>,
    mix: Mix,
    stream: bool,
    nonce: String,
    /// Pre-serialized bodies, one per corpus line (identical and Zipf).
    bodies: Vec<Bytes>,
    zipf: Option<Zipf<f64>>,
}

impl Workload {
    /// With `stream`, only the prompts of endpoints that can stream are kept.
    pub fn new(prompts: &[Prompt], mix: Mix, stream: bool, nonce: &str) -> anyhow::Result<Self> {
        let prompts: Vec<Prompt> = prompts
            .iter()
            .filter(|p| !stream || p.endpoint != Endpoint::Embeddings)
            .cloned()
            .collect();
        ensure!(!prompts.is_empty(), "no prompt of the corpus fits this mix");
        if let Mix::Identical { index } = mix {
            ensure!(
                index < prompts.len(),
                "identical:{index} is beyond the corpus ({} usable lines)",
                prompts.len()
            );
        }
        let zipf = match mix {
            Mix::Zipf { s } => Some(Zipf::new(prompts.len() as f64, s).context("Zipf")?),
            _ => None,
        };
        let mut workload = Self {
            prompts,
            mix,
            stream,
            nonce: nonce.to_owned(),
            bodies: Vec::new(),
            zipf,
        };
        if mix != Mix::Distinct {
            workload.bodies = (0..workload.prompts.len())
                .map(|i| workload.body(i, None))
                .collect();
        }
        Ok(workload)
    }

    /// How many different corpus lines the mix can draw from.
    pub fn prompt_count(&self) -> usize {
        self.prompts.len()
    }

    /// The request numbered `seq` of the run.
    pub fn request(&self, seq: u64, rng: &mut impl Rng) -> Prepared {
        let (prompt, body) = match self.mix {
            Mix::Identical { index } => (index, self.bodies[index].clone()),
            Mix::Zipf { .. } => {
                let zipf = self.zipf.as_ref().expect("a Zipf mix has its distribution");
                // Samples are ranks 1..=n as floats.
                let rank = zipf.sample(rng) as usize;
                let index = rank.clamp(1, self.prompts.len()) - 1;
                (index, self.bodies[index].clone())
            }
            Mix::Distinct => {
                let index = (seq % self.prompts.len() as u64) as usize;
                (index, self.body(index, Some(seq)))
            }
        };
        Prepared {
            path: self.prompts[prompt].endpoint.path(),
            body,
            prompt,
        }
    }

    fn body(&self, index: usize, unique: Option<u64>) -> Bytes {
        let mut body = self.prompts[index].body.clone();
        let marker = match unique {
            Some(seq) => format!(" [bench {} #{seq}]", self.nonce),
            None => format!(" [bench {}]", self.nonce),
        };
        mark(&mut body, &marker);
        if self.stream {
            body.insert("stream".into(), Value::Bool(true));
        }
        Bytes::from(serde_json::to_vec(&body).expect("a JSON map serializes"))
    }
}

/// Appends `marker` to the request's text (the last message, the input or the
/// prompt), which every endpoint keys, so the marked body gets its own key.
fn mark(body: &mut Map<String, Value>, marker: &str) {
    fn append(value: &mut Value, marker: &str) -> bool {
        match value {
            Value::String(text) => {
                text.push_str(marker);
                true
            }
            Value::Array(items) => items.last_mut().is_some_and(|last| append(last, marker)),
            Value::Object(message) => message
                .get_mut("content")
                .is_some_and(|content| append(content, marker)),
            _ => false,
        }
    }
    for field in ["messages", "input", "prompt"] {
        if body
            .get_mut(field)
            .is_some_and(|value| append(value, marker))
        {
            return;
        }
    }
    // No text field: a field of its own still makes the key unique (an
    // unknown field is keyed; `metadata` is a label field and is not).
    body.insert("bench_marker".into(), serde_json::json!(marker));
}

#[cfg(test)]
mod tests {
    use rand::{SeedableRng, rngs::StdRng};
    use serde_json::json;

    use super::*;

    fn corpus() -> Vec<Prompt> {
        load_corpus(
            &Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("prompts/corpus.jsonl"),
        )
        .unwrap()
    }

    #[test]
    fn mixes_parse_and_print_back() {
        for text in [
            "identical:0",
            "identical:7",
            "distinct",
            "zipf:1.1",
            "zipf:0.8",
        ] {
            assert_eq!(text.parse::<Mix>().unwrap().to_string(), text);
        }
        assert_eq!("zipf".parse::<Mix>().unwrap(), Mix::Zipf { s: 1.1 });
        assert!("zipf:-1".parse::<Mix>().is_err());
        assert!("random".parse::<Mix>().is_err());
    }

    #[test]
    fn identical_repeats_one_body_and_distinct_never_does() {
        let mut rng = StdRng::seed_from_u64(1);
        let same = Workload::new(&corpus(), Mix::Identical { index: 0 }, false, "n").unwrap();
        assert_eq!(
            same.request(0, &mut rng).body,
            same.request(9, &mut rng).body
        );
        let distinct = Workload::new(&corpus(), Mix::Distinct, false, "n").unwrap();
        let bodies: std::collections::HashSet<Bytes> = (0..500)
            .map(|i| distinct.request(i, &mut rng).body)
            .collect();
        assert_eq!(bodies.len(), 500);
    }

    #[test]
    fn zipf_favours_the_first_lines() {
        let mut rng = StdRng::seed_from_u64(7);
        let zipf = Workload::new(&corpus(), Mix::Zipf { s: 1.1 }, false, "n").unwrap();
        let mut counts = vec![0u32; zipf.prompt_count()];
        for i in 0..10_000 {
            counts[zipf.request(i, &mut rng).prompt] += 1;
        }
        assert!(counts[0] > counts[1] && counts[1] > counts[9], "{counts:?}");
    }

    #[test]
    fn streams_skip_embeddings_and_ask_for_a_stream() {
        let mut rng = StdRng::seed_from_u64(1);
        let stream = Workload::new(&corpus(), Mix::Zipf { s: 1.1 }, true, "n").unwrap();
        for i in 0..200 {
            let request = stream.request(i, &mut rng);
            assert_ne!(request.path, "/embeddings");
            let body: Value = serde_json::from_slice(&request.body).unwrap();
            assert_eq!(body["stream"], true);
        }
    }

    #[test]
    fn the_marker_lands_in_the_text() {
        let mut chat = json!({"messages": [{"role": "user", "content": "hi"}]});
        mark(chat.as_object_mut().unwrap(), " [x]");
        assert_eq!(chat["messages"][0]["content"], "hi [x]");
        let mut embedding = json!({"input": ["a", "b"]});
        mark(embedding.as_object_mut().unwrap(), " [x]");
        assert_eq!(embedding["input"], json!(["a", "b [x]"]));
        let mut other = json!({"model": "m"});
        mark(other.as_object_mut().unwrap(), " [x]");
        assert_eq!(other["bench_marker"], " [x]");
    }
}
