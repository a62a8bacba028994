//! The agent a local (one-machine) search starts for itself, stopped with the search
//! (and with its parent, should the master die).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::SearchError;

/// Makes the child get SIGTERM when the process that started it dies, however it dies
/// (killed, or aborted by a launcher): an agent never outlives its job.
pub fn with_parent_death(c: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches only the child being created.
    unsafe {
        c.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        })
    }
}

/// A node agent started for a local-mode run (killed on drop).
pub struct LocalAgent {
    child: Child,
    pub namespace: String,
}

impl LocalAgent {
    /// Starts the agent (pinned to core `cpu`, if given) and waits until it serves.
    pub fn start(exe: &Path, namespace: &str, cpu: Option<usize>) -> Result<LocalAgent, SearchError> {
        let child = with_parent_death(&mut Command::new(exe))
            .args(["agent", "--namespace", namespace, "--node-id", "1"])
            .args(cpu.map(|c| format!("--cpu={c}")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| SearchError::Io(format!("starting the agent ({}): {e}", exe.display())))?;
        let a = LocalAgent { child, namespace: namespace.to_string() };
        gepsea_client::wait_for_agent(namespace, 1, Duration::from_secs(20))
            .map_err(|e| SearchError::Io(format!("agent did not start: {e}")))?;
        Ok(a)
    }
}

impl Drop for LocalAgent {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
