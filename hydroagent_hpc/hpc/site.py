"""Slurm site settings: the options every job shares, defined once (no executor, no subprocess here).

:class:`SlurmFields` is what :class:`SiteSettings` (one job's request, the ``submit`` commands'
``--partition``, ``--time``, ... generated from its fields) and the pipeline's site file
(:class:`hydroagent_hpc.pipeline.submit.Site`) share. :mod:`hydroagent_hpc.hpc.slurm` turns a
:class:`SiteSettings` into a submitit executor. Values not given come from the same environment
variables ``sbatch`` reads (``SBATCH_PARTITION``, ``SBATCH_ACCOUNT``, ``SBATCH_QOS``) plus
``HYDROAGENT_MODULES`` and ``HYDROAGENT_SETUP``.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from typing import Any

from hydroagent_hpc.settings import Settings, invalid, setting

__all__ = ["SlurmFields", "SiteSettings", "SITE_OPTIONS"]

#: The most memory per node a job may ask for, in GB (100 TB: more than any node holds).
MAX_MEM_GB = 1e5


@dataclass(frozen=True)
class SlurmFields(Settings):
    """The Slurm options every job shares, defined once: :class:`SiteSettings` (one job's request, the
    command line's ``--partition``, ``--time``, ...) and the pipeline's site file
    (:class:`hydroagent_hpc.pipeline.submit.Site`) both take them from here. ``None`` leaves the choice
    to the site's defaults."""

    partition: str | None = setting(None, nonempty=True, help="Slurm partition (default: $SBATCH_PARTITION, else "
                                                              "the site's)")
    account: str | None = setting(None, nonempty=True, help="Slurm account (default: $SBATCH_ACCOUNT)")
    qos: str | None = setting(None, nonempty=True, help="Slurm QOS (default: $SBATCH_QOS)")
    constraint: str | None = setting(None, nonempty=True, help="Slurm node constraint (--constraint)")
    cpus_per_task: int = setting(1, ge=1, help="CPUs per task")
    mem_gb: float | None = setting(None, gt=0, le=MAX_MEM_GB, help="memory per node in GB (null: the site's default)",
                                   fix=f"give the memory per node in GB, above 0 and at most {MAX_MEM_GB:.0f}")
    array_parallelism: int = setting(64, ge=1, help="array tasks running at once")
    modules: tuple[str, ...] = setting((), flag="--module", help="environment modules to load before the job "
                                                                 "(default: $HYDROAGENT_MODULES)")
    setup: tuple[str, ...] = setting((), flag="--setup", help="shell lines run before the job (default: "
                                                              "$HYDROAGENT_SETUP, ';'-separated)")

    def check(self) -> None:
        for name in ("modules", "setup"):
            if any(not v for v in getattr(self, name)):
                raise invalid(name, "holds an empty entry")


@dataclass(frozen=True)
class SiteSettings(SlurmFields):
    """One job's request: the shared Slurm fields plus its time, tasks and GPUs."""

    time_min: int = setting(60, ge=1, flag="--time", help="time limit per job in minutes")
    ntasks: int = setting(1, ge=1, help="tasks per job (MPI ranks; srun --mpi=pmi2)")
    gpus_per_node: int = setting(0, ge=0, help="GPUs per node")
    #: the names whose values were given (command line or environment), not defaults: see :meth:`has`
    given: tuple[str, ...] = setting((), help="(internal) the settings given rather than defaulted")

    @classmethod
    def from_env(cls, **given: Any) -> SiteSettings:
        """Settings from ``given`` (None values ignored), then the environment, then the defaults."""
        env = os.environ
        values: dict[str, Any] = {
            "partition": env.get("SBATCH_PARTITION") or None,
            "account": env.get("SBATCH_ACCOUNT") or None,
            "qos": env.get("SBATCH_QOS") or None,
            "modules": tuple(env.get("HYDROAGENT_MODULES", "").split()),
            "setup": tuple(s.strip() for s in env.get("HYDROAGENT_SETUP", "").split(";") if s.strip()),
        }
        values.update({k: v for k, v in given.items() if v is not None})
        values["given"] = tuple(sorted(k for k, v in values.items() if v not in (None, ())))
        return cls(**values)

    def has(self, name: str) -> bool:
        """Whether ``name`` was given rather than left at its default: named in ``given`` (what
        :meth:`from_env` saw), or, for settings built directly, different from the default."""
        return name in self.given or getattr(self, name) != getattr(type(self)(), name)

    def setup_lines(self) -> list[str]:
        lines = [f"module load {' '.join(self.modules)}"] if self.modules else []
        return lines + list(self.setup)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def with_(self, **changes: Any) -> SiteSettings:
        return replace(self, **changes)


#: The fields of :class:`SiteSettings` the ``submit`` commands take as options (``--partition``, ``--time``, ...).
SITE_OPTIONS = ("partition", "account", "qos", "constraint", "time_min", "cpus_per_task", "mem_gb", "modules")
