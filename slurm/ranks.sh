# ranks.sh - sourced by sft.sbatch and grpo.sbatch: pass Slurm's signals on to the trainer ranks that a
# launcher (accelerate launch, torchrun) started; and (rank_exec) start one MPI rank of grpo.sbatch with its
# CPUs, threads and GPUs. Those launchers do not forward SIGUSR1 (accelerate's and
# torchrun's own handling ends the workers), so the save-and-requeue warning goes to the ranks themselves.
#
#   RANKS_MODULE   the trainer module: a rank is a direct child of the launcher whose command line holds it
#   RANKS_PLAIN=1  the "launcher" is the trainer itself (one plain process) or srun (which passes signals on
#                  to every task): signals go to it directly

# The trainer ranks under launcher $1: its direct children that run $RANKS_MODULE.
ranks_of() { ps -o pid=,args= --ppid "$1" 2>/dev/null | awk -v m="$RANKS_MODULE" 'index($0, m) {print $1}' || true; }

# Send signal $1 to the trainer ranks under launcher $2 (the launcher itself when RANKS_PLAIN=1).
# A launcher would die on SIGUSR1, so it only ever gets SIGTERM (which it passes on), and only when no
# rank has started yet.
signal_ranks() {
  local sig=$1 launcher=$2 ranks
  if [ "${RANKS_PLAIN:-0}" = 1 ]; then
    kill "-$sig" "$launcher" 2>/dev/null || true
    return
  fi
  ranks=$(ranks_of "$launcher")
  if [ -n "$ranks" ]; then
    # shellcheck disable=SC2086
    kill "-$sig" $ranks 2>/dev/null || true
  elif [ "$sig" = TERM ]; then
    kill -TERM "$launcher" 2>/dev/null || true
  else
    echo "warning: no trainer rank under launcher $launcher yet; SIG$sig not forwarded" >&2
  fi
}

# --------------------------------------------------------------------------- one MPI rank's CPUs and GPUs
#
#   rank_exec T TRAINER_CPUS ENGINE_CPUS CPU_LIST COMMAND...
#
# What grpo.sbatch's `srun --mpi=pmi2` step runs on every rank (SLURM_CPU_BIND=none: srun pins no task to
# one CPU; the step holds all the job's CPUs on the node): it sets this rank up, then execs COMMAND.
# Ranks 0..T-1 train: OMP_NUM_THREADS=TRAINER_CPUS and every GPU of the node (trainer r uses cuda:r; a
# launched engine takes the GPUs after the first T). Ranks T.. simulate: one thread, no GPU, SIGUSR1
# ignored (srun passes the checkpoint signal to every rank; only trainers act on it; an ignored signal
# stays ignored across exec and in the processes a rank starts).
# CPU_LIST (comma-separated CPU ids, or empty) is the job's CPUs on this node in the order they are
# handed out: rank 0 the first TRAINER_CPUS + ENGINE_CPUS (trainer rank 0 plays the rollouts, and a
# launched engine is its child: HYDROAGENT_ENGINE_CPUS names the last ENGINE_CPUS of them), trainer r
# the next TRAINER_CPUS each, then one per simulation rank; the rank is pinned to its own (taskset) and
# HYDROAGENT_RANK_CPUS says which. Empty: no pinning (the ranks share the step's CPUs; the thread counts
# still keep the simulation ranks to one CPU each).

# rank_cpus RANK T TRAINER_CPUS ENGINE_CPUS: "FIRST COUNT", this rank's slice of the CPU list.
rank_cpus() {
  local r=$1 t=$2 c=$3 e=$4
  if [ "$r" -eq 0 ]; then
    echo "0 $(( c + e ))"
  elif [ "$r" -lt "$t" ]; then
    echo "$(( c + e + (r - 1) * c )) $c"
  else
    echo "$(( t * c + e + r - t )) 1"
  fi
}

rank_exec() {
  local t=$1 c=$2 e=$3 list=$4 r=${SLURM_PROCID:-0} first count mine
  shift 4
  read -r first count < <(rank_cpus "$r" "$t" "$c" "$e")
  if [ "$r" -ge "$t" ]; then
    trap "" USR1
    export CUDA_VISIBLE_DEVICES=
    export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
  else
    export OMP_NUM_THREADS=$c MKL_NUM_THREADS=$c
  fi
  if [ -n "$list" ]; then
    local -a cpus
    IFS=, read -r -a cpus <<< "$list"
    mine=$(IFS=,; echo "${cpus[*]:first:count}")
    export HYDROAGENT_RANK_CPUS=$mine
    if [ "$r" -eq 0 ] && [ "$e" -gt 0 ]; then
      HYDROAGENT_ENGINE_CPUS=$(IFS=,; echo "${cpus[*]:$(( first + c )):e}")
      export HYDROAGENT_ENGINE_CPUS
    fi
    exec taskset -c "$mine" "$@"
  fi
  exec "$@"
}
