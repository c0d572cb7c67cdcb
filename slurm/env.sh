# env.sh - sourced by every hydroagent sbatch script: site settings, modules, the Python environment.
# Nothing here needs editing; each value comes from the environment or from a site file.
#
#   HYDROAGENT_HOME     the repository checkout (default: the folder sbatch was called from)
#   HYDROAGENT_SITE     a site file to source first (default: $HYDROAGENT_HOME/slurm/site.env when it
#                       exists; copy slurm/site.env.example). Put exports there, not edits in the scripts.
#   HYDROAGENT_MODULES  environment modules to `module load`, space-separated (e.g. "python/3.11")
#   HYDROAGENT_VENV     the Python environment (default: $HYDROAGENT_HOME/.venv, made by `make venv`);
#                       jobs call its interpreter by absolute path, never whatever `python` is on PATH
: "${HYDROAGENT_HOME:=${SLURM_SUBMIT_DIR:-$PWD}}"
export HYDROAGENT_HOME
_site=${HYDROAGENT_SITE:-$HYDROAGENT_HOME/slurm/site.env}
if [ -f "$_site" ]; then
  # shellcheck disable=SC1090
  source "$_site"
elif [ -n "${HYDROAGENT_SITE:-}" ]; then
  echo "error: HYDROAGENT_SITE=$HYDROAGENT_SITE does not exist; fix the path or unset it" >&2
  exit 2
fi
if [ -n "${HYDROAGENT_MODULES:-}" ]; then
  if ! command -v module >/dev/null 2>&1; then
    echo "error: HYDROAGENT_MODULES='$HYDROAGENT_MODULES' but this node has no 'module' command; unset it" >&2
    exit 2
  fi
  # shellcheck disable=SC2086
  module load $HYDROAGENT_MODULES
fi
: "${HYDROAGENT_VENV:=$HYDROAGENT_HOME/.venv}"
HYDROAGENT=$HYDROAGENT_VENV/bin/hydroagent
if [ ! -x "$HYDROAGENT" ]; then
  echo "error: $HYDROAGENT not found: run 'make venv' in $HYDROAGENT_HOME, or set HYDROAGENT_VENV" \
       "(or HYDROAGENT_HOME when you submit from another folder)" >&2
  exit 2
fi
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-$HYDROAGENT_HOME/.cache/numba}
export PYTHONUNBUFFERED=1
