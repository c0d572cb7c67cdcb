# ranks.sh - sourced by sft.sbatch and grpo.sbatch: pass Slurm's signals on to the trainer ranks that a
# launcher (accelerate launch, torchrun) started. Those launchers do not forward SIGUSR1 (accelerate's and
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
