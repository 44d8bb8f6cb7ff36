//! A process that a launcher started but that cannot reach it: init
//! refuses, naming the launcher and the command that works, instead of
//! running as a world of one. N such processes would each be "rank 0 of 1",
//! give wrong answers and exit 0.
//!
//! One process is a world of one whoever started it (`mpirun -n 1`,
//! `srun -n 1`): the answer is right, so that is not refused.

/// What the environment says about a launcher fmx cannot use (read through
/// `var`), or `None`: no launcher, or one that started a single process.
pub(crate) fn unusable_launcher(var: impl Fn(&str) -> Option<String>) -> Option<String> {
    let count = |name: &str| var(name).and_then(|v| v.trim().parse::<u64>().ok());
    let srun_tasks = count("SLURM_STEP_NUM_TASKS");
    let pmix = [
        "PMIX_RANK",
        "PMIX_NAMESPACE",
        "PMIX_SERVER_URI41",
        "PMIX_SERVER_URI4",
        "PMIX_SERVER_URI3",
        "PMIX_SERVER_URI21",
        "PMIX_SERVER_URI2",
    ]
    .into_iter()
    .find(|v| var(v).is_some());
    let ompi_size = count("OMPI_COMM_WORLD_SIZE");
    if let Some(n) = srun_tasks.filter(|&n| n > 1) {
        return Some(match pmix {
            Some(v) => format!(
                "started by srun with {n} tasks over PMIx ({v} is set: srun --mpi=pmix), but this build of fmx has no PMIx client: \
                 run `srun --mpi=pmi2`, or build fmx with the cargo feature `pmix`"
            ),
            None if cfg!(feature = "pmix") => {
                format!("started by srun with {n} tasks but no PMI (PMI_FD is not set): run `srun --mpi=pmi2` or `srun --mpi=pmix`")
            }
            None => format!("started by srun with {n} tasks but no PMI (PMI_FD is not set): run `srun --mpi=pmi2`"),
        });
    }
    if pmix.is_some() || ompi_size.is_some() {
        let size = ompi_size.or_else(|| count("PMIX_SIZE"));
        if size == Some(1) {
            return None;
        }
        let what = match (ompi_size, pmix) {
            (Some(n), _) => format!("Open MPI's mpirun with {n} processes (OMPI_COMM_WORLD_SIZE={n})"),
            (None, Some(v)) => format!("a PMIx launcher ({v} is set)"),
            (None, None) => unreachable!("one of them is set"),
        };
        return Some(format!(
            "started by {what}, but this build of fmx has no PMIx client: build fmx with the cargo feature `pmix`, \
             or start it with fmxrun, with MPICH's mpiexec (PMI-1 or PMI-2), or with `srun --mpi=pmi2`"
        ));
    }
    if let Some(port) = var("PMI_PORT") {
        return Some(format!(
            "started by a PMI process manager that gave PMI_PORT={port} (Hydra's -pmi-port) but no PMI_FD: fmx speaks PMI over \
             the socket the manager hands over in PMI_FD; run mpiexec without -pmi-port"
        ));
    }
    if let Some(n) = count("PMI_SIZE").filter(|&n| n > 1) {
        return Some(format!(
            "PMI_SIZE={n} is set but PMI_FD is not: the process manager started {n} processes without a PMI connection \
             (run them with fmxrun or MPICH's mpiexec)"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::unusable_launcher;

    fn with(vars: &[(&str, &str)]) -> Option<String> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        unusable_launcher(move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn srun_without_pmi_names_the_task_count_and_the_fix() {
        let e = with(&[("SLURM_STEP_NUM_TASKS", "4"), ("SLURM_NTASKS", "4"), ("SLURM_PROCID", "2")]).expect("refused");
        assert!(e.contains("srun with 4 tasks but no PMI") && e.contains("srun --mpi=pmi2"), "{e}");
        let e = with(&[("SLURM_STEP_NUM_TASKS", "4"), ("PMIX_RANK", "1")]).expect("refused");
        assert!(e.contains("over PMIx") && e.contains("no PMIx client") && e.contains("srun --mpi=pmi2"), "{e}");
    }

    #[test]
    fn open_mpi_and_pmix_launchers_are_named() {
        let e = with(&[("OMPI_COMM_WORLD_SIZE", "4"), ("OMPI_COMM_WORLD_RANK", "3"), ("PMIX_RANK", "3")]).expect("refused");
        assert!(e.contains("Open MPI's mpirun with 4 processes") && e.contains("no PMIx client") && e.contains("fmxrun"), "{e}");
        let e = with(&[("PMIX_NAMESPACE", "prterun-x-1")]).expect("refused");
        assert!(e.contains("a PMIx launcher (PMIX_NAMESPACE is set)"), "{e}");
    }

    #[test]
    fn hydra_without_a_pmi_socket_is_named() {
        let e = with(&[("PMI_PORT", "127.0.0.1:37845"), ("PMI_ID", "1")]).expect("refused");
        assert!(e.contains("PMI_PORT=127.0.0.1:37845") && e.contains("without -pmi-port"), "{e}");
        let e = with(&[("PMI_SIZE", "3"), ("PMI_RANK", "0")]).expect("refused");
        assert!(e.contains("PMI_SIZE=3 is set but PMI_FD is not"), "{e}");
    }

    #[test]
    fn one_process_or_no_launcher_is_a_world_of_one() {
        assert_eq!(with(&[]), None);
        // A batch script: Slurm's job variables, no step of srun.
        assert_eq!(with(&[("SLURM_NTASKS", "4"), ("SLURM_PROCID", "0"), ("SLURM_JOB_ID", "7")]), None);
        assert_eq!(with(&[("SLURM_STEP_NUM_TASKS", "1")]), None);
        assert_eq!(with(&[("OMPI_COMM_WORLD_SIZE", "1"), ("PMIX_RANK", "0")]), None);
        assert_eq!(with(&[("PMI_SIZE", "1")]), None);
    }
}
