//! What the launcher (`mpirun`, `srun`, `mpiexec`) tells a process about its job.
//!
//! Only facts every launcher provides are trusted for identity: the rank, the job size
//! and an id of this launch. Which node a rank runs on is *not* derived from rank
//! arithmetic (`--map-by node`, `srun --distribution=cyclic` and hostfiles with uneven
//! slots all break it); the processes find that out among themselves through the
//! rendezvous directory ([`super::meet`]). The per-node variables the launchers set
//! (processes per node, Slurm's task layout, the node count) are read only to check
//! what the rendezvous found, so a misconfigured host identity fails with a clear
//! message instead of a hang.

/// Where this process sits in a launched job, as the launcher describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub rank: usize,
    pub size: usize,
    /// Processes of this job on this node, where the launcher says.
    pub local_size: Option<usize>,
    /// Nodes of this job (step), where the launcher says.
    pub nodes: Option<usize>,
    /// An id of this launch, the same in every process of it and new for every launch
    /// (`None` where the launcher sets none: see [`Launch::job_id`]).
    pub job: Option<String>,
}

/// Launch ids, most specific first: the launch of this very process group, then the
/// batch job's step. `GEPSEA_JOB_ID` lets a user supply one where the launcher has none.
const JOB_IDS: &[&[&str]] = &[&["GEPSEA_JOB_ID"], &["PMIX_NAMESPACE"], &["OMPI_MCA_ess_base_jobid"], &["SLURM_JOB_ID", "SLURM_STEP_ID"]];

impl Launch {
    /// The launch id, or an error that says how to provide one.
    pub fn job_id(&self) -> Result<&str, String> {
        self.job.as_deref().ok_or_else(|| {
            "the launcher sets no id for this launch (PMIX_NAMESPACE, OMPI_MCA_ess_base_jobid or SLURM_JOB_ID/SLURM_STEP_ID), so processes of this run cannot be told from an earlier one's: set GEPSEA_JOB_ID to a value unique to this run in every process (e.g. mpiexec -genv GEPSEA_JOB_ID $(date +%s%N) ...)".to_string()
        })
    }
}

/// Reads the launcher's environment (OpenMPI, Slurm, MPICH/Hydra, PMIx); `None` outside
/// a launcher.
pub fn detect() -> Option<Launch> {
    detect_from(|n| std::env::var(n).ok())
}

/// [`detect`] over any environment (`get` returns a variable's value).
pub fn detect_from(get: impl Fn(&str) -> Option<String>) -> Option<Launch> {
    let num = |names: &[&str]| names.iter().find_map(|n| get(n)?.trim().parse::<usize>().ok());
    let rank = num(&["OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK", "PMIX_RANK"])?;
    let size = num(&["OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "PMI_SIZE"])?;
    let slurm_local = || {
        let layout = get("SLURM_STEP_TASKS_PER_NODE").or_else(|| get("SLURM_TASKS_PER_NODE"))?;
        slurm_tasks_on_node(&layout, num(&["SLURM_NODEID"])?)
    };
    let local_size = num(&["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"]).or_else(slurm_local);
    // OpenMPI's OMPI_MCA_orte_num_nodes counts the allocation, not the nodes in use.
    let nodes = num(&["SLURM_STEP_NUM_NODES"]);
    let job = JOB_IDS.iter().find_map(|parts| {
        let values: Option<Vec<String>> = parts.iter().map(|p| get(p).filter(|v| !v.trim().is_empty())).collect();
        values.map(|v| v.join("."))
    });
    Some(Launch { rank, size, local_size, nodes, job })
}

/// Tasks on node `node` (0-based) of Slurm's compressed layout, e.g. `2(x3),1` for
/// three nodes with two tasks and one with one.
pub fn slurm_tasks_on_node(layout: &str, node: usize) -> Option<usize> {
    let mut seen = 0;
    for group in layout.split(',') {
        let (count, repeat) = match group.split_once("(x") {
            Some((c, r)) => (c.trim().parse::<usize>().ok()?, r.strip_suffix(')')?.parse::<usize>().ok()?),
            None => (group.trim().parse::<usize>().ok()?, 1),
        };
        if node < seen + repeat {
            return Some(count);
        }
        seen += repeat;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |n| vars.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string())
    }

    #[test]
    fn launchers_are_recognised_by_their_environment() {
        assert_eq!(detect_from(env(&[])), None);
        let ompi = [
            ("OMPI_COMM_WORLD_RANK", "5"),
            ("OMPI_COMM_WORLD_SIZE", "6"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("OMPI_MCA_orte_num_nodes", "3"),
            ("OMPI_MCA_ess_base_jobid", "1672413185"),
            ("PMIX_NAMESPACE", "1672413185"),
        ];
        let want = Launch { rank: 5, size: 6, local_size: Some(2), nodes: None, job: Some("1672413185".into()) };
        assert_eq!(detect_from(env(&ompi)), Some(want));
        // srun with a block of 2 then a node with 1: the node's task count comes from
        // the compressed layout, the step id tells two steps of one allocation apart.
        let slurm = [
            ("SLURM_PROCID", "4"),
            ("SLURM_NTASKS", "5"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NODEID", "2"),
            ("SLURM_STEP_TASKS_PER_NODE", "2(x2),1"),
            ("SLURM_STEP_NUM_NODES", "3"),
            ("SLURM_JOB_ID", "812"),
            ("SLURM_STEP_ID", "3"),
        ];
        let want = Launch { rank: 4, size: 5, local_size: Some(1), nodes: Some(3), job: Some("812.3".into()) };
        assert_eq!(detect_from(env(&slurm)), Some(want));
        // MPICH's Hydra sets no launch id; the user's GEPSEA_JOB_ID is one.
        let hydra = [("PMI_RANK", "2"), ("PMI_SIZE", "4"), ("MPI_LOCALRANKID", "0"), ("MPI_LOCALNRANKS", "2")];
        let l = detect_from(env(&hydra)).unwrap();
        assert_eq!((l.rank, l.size, l.local_size, l.nodes, l.job.clone()), (2, 4, Some(2), None, None));
        assert!(l.job_id().unwrap_err().contains("GEPSEA_JOB_ID"));
        let with_id = [("PMI_RANK", "2"), ("PMI_SIZE", "4"), ("GEPSEA_JOB_ID", "run-7")];
        assert_eq!(detect_from(env(&with_id)).unwrap().job_id(), Ok("run-7"));
    }

    #[test]
    fn slurm_task_layouts_are_expanded() {
        assert_eq!(slurm_tasks_on_node("4", 0), Some(4));
        assert_eq!(slurm_tasks_on_node("4", 1), None);
        assert_eq!(slurm_tasks_on_node("2(x3),1", 0), Some(2));
        assert_eq!(slurm_tasks_on_node("2(x3),1", 2), Some(2));
        assert_eq!(slurm_tasks_on_node("2(x3),1", 3), Some(1));
        assert_eq!(slurm_tasks_on_node("1,3(x2)", 2), Some(3));
        assert_eq!(slurm_tasks_on_node("2(x", 0), None);
    }
}
