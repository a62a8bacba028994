//! The agent a local (one-machine) search starts for itself, stopped with the search
//! (and with its parent, should the master die).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::SearchError;
pub use crate::tools::with_parent_death;

/// How many times a search starts an agent again after it died: a search on one
/// machine its own agent, a launched job's node leader its node's.
pub(crate) const MAX_AGENT_RESTARTS: usize = 3;

/// A node agent started for a local-mode run (killed on drop).
pub struct LocalAgent {
    child: Child,
    pub namespace: String,
}

impl LocalAgent {
    /// Starts the agent (pinned to core `cpu`, if given) and waits until it serves. An
    /// agent that exits instead (a bad `--cpu`, a namespace in use) is reported at once,
    /// with its own error as the reason.
    pub fn start(exe: &Path, namespace: &str, cpu: Option<usize>) -> Result<LocalAgent, SearchError> {
        let mut child = with_parent_death(&mut Command::new(exe))
            .args(crate::quiet().then_some("-q"))
            .args(["agent", "--namespace", namespace, "--node-id", "1"])
            .args(cpu.map(|c| format!("--cpu={c}")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| SearchError::Io(format!("starting the agent ({}): {e}", exe.display())))?;
        let stderr = StderrRelay::start(child.stderr.take().expect("stderr is piped"));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if gepsea_client::status(namespace, 1).is_ok() {
                stderr.relay_from_now();
                return Ok(LocalAgent { child, namespace: namespace.to_string() });
            }
            if let Ok(Some(status)) = child.try_wait() {
                // Killed, not failed: ended under the search as a running agent can be.
                if std::os::unix::process::ExitStatusExt::signal(&status).is_some() {
                    return Err(SearchError::own_agent_ended(child.id(), status));
                }
                let why = stderr.wait_last_line().unwrap_or_else(|| format!("it exited with {status}"));
                let why = why.strip_prefix("gepsea: error: ").unwrap_or(&why);
                return Err(SearchError::Io(format!("the agent did not start: {why}")));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(SearchError::Io(format!(
                    "the agent did not serve namespace {namespace} within 20 s (see `gepsea agent status --namespace {namespace}`)"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The agent's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How the agent ended, if it has, waiting up to `patience` for it (a search that
    /// lost contact with its agent may notice before the agent is reaped).
    pub fn ended(&mut self, patience: Duration) -> Option<std::process::ExitStatus> {
        crate::tools::wait_for_exit(&mut self.child, patience)
    }
}

/// Holds the agent's stderr until it serves (so that a failed start becomes one error
/// line), then passes it through to ours (its logs stay visible).
struct StderrRelay {
    shared: std::sync::Arc<std::sync::Mutex<RelayState>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct RelayState {
    held: Vec<String>,
    relay: bool,
}

impl StderrRelay {
    fn start(from: std::process::ChildStderr) -> StderrRelay {
        use std::io::BufRead;
        let shared = std::sync::Arc::new(std::sync::Mutex::new(RelayState::default()));
        let s = shared.clone();
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(from).lines().map_while(Result::ok) {
                let mut st = s.lock().unwrap();
                if st.relay {
                    relay!("{line}");
                } else {
                    st.held.push(line);
                }
            }
        });
        StderrRelay { shared, reader: Some(reader) }
    }

    fn relay_from_now(mut self) {
        let mut st = self.shared.lock().unwrap();
        for l in st.held.drain(..) {
            relay!("{l}");
        }
        st.relay = true;
        drop(st);
        // The thread ends with the agent's stderr.
        self.reader.take();
    }

    /// The agent has exited: its last non-empty line.
    fn wait_last_line(mut self) -> Option<String> {
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        let st = self.shared.lock().unwrap();
        st.held.iter().rev().find(|l| !l.trim().is_empty()).cloned()
    }
}

impl Drop for LocalAgent {
    fn drop(&mut self) {
        crate::tools::terminate(&mut self.child, Duration::from_secs(3));
    }
}
