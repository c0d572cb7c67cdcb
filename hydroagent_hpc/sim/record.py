"""The kernel's parameter record: every per-node parameter in one float64 array, its rows in ONE order.

:data:`NODE_FIELDS` is the only definition of that order. The others are checked against it:

- the numba kernel (:mod:`hydroagent_hpc.sim.kernel`) holds a literal copy, compared at import (a literal,
  so that numba's cache, keyed on that file, is rebuilt when the order changes);
- the C kernel (``crest_kernel.c``) lists the fields of its ``hak_node_params`` struct in the X-macro
  ``HAK_NODE_FIELDS`` and exports their names and the struct's size; :mod:`hydroagent_hpc.sim.ckernel`
  builds its ``ctypes.Structure`` from :data:`NODE_FIELDS` and refuses a library that disagrees when it
  loads it (:class:`~hydroagent_hpc.sim.ckernel.KernelRecordMismatch`).

A run's record is [len(NODE_FIELDS), n]; a batch's is [len(NODE_FIELDS), K, n] (each field one [K, n] block,
which is what the C struct's pointers point to). The channel mask is not a float and travels beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["NODE_FIELDS", "N_FIELDS", "NodeParams", "stack_batch"]

#: The per-node parameters, in the kernel record's order (EF5's order: CREST, then kinematic wave;
#: ``w0`` is the initial soil water from IWU, ``ir0`` the initial interflow from ISU).
NODE_FIELDS: tuple[str, ...] = ("wm", "b", "im", "ke", "fc", "w0", "under", "leaki", "ir0", "alpha", "beta",
                                "alpha0")
N_FIELDS = len(NODE_FIELDS)
_ROW = {name: i for i, name in enumerate(NODE_FIELDS)}


@dataclass(frozen=True, eq=False)
class NodeParams:
    """Effective per-node parameters after grids, percent rules and EF5's clamps, as the kernels take them.

    ``values``: float64 [len(NODE_FIELDS), n], C-contiguous, rows in :data:`NODE_FIELDS` order (``p.wm``
    and so on read a row); ``channel``: bool [n]. Made by
    :meth:`hydroagent_hpc.sim.embedded.EmbeddedSimulator.node_params` from a validated parameter set.
    """

    values: np.ndarray
    channel: np.ndarray

    @classmethod
    def of(cls, channel: np.ndarray, **fields: np.ndarray) -> NodeParams:
        """The record of the named per-node arrays (every one of :data:`NODE_FIELDS`, nothing else)."""
        if set(fields) != set(NODE_FIELDS):
            missing = sorted(set(NODE_FIELDS) - set(fields))
            extra = sorted(set(fields) - set(NODE_FIELDS))
            raise ValueError(f"NodeParams: missing fields {missing}, unknown fields {extra}")
        values = np.empty((N_FIELDS, np.asarray(channel).size))
        for i, name in enumerate(NODE_FIELDS):
            values[i] = fields[name]
        return cls(values, np.asarray(channel, dtype=np.bool_))

    def __getattr__(self, name: str) -> np.ndarray:
        row = _ROW.get(name)
        if row is None:
            raise AttributeError(f"NodeParams has no field {name!r}")
        return self.values[row]


def stack_batch(records: list[NodeParams]) -> tuple[np.ndarray, np.ndarray]:
    """The batch record [len(NODE_FIELDS), K, n] and the channel masks [K, n] of K records."""
    return (np.ascontiguousarray(np.stack([r.values for r in records], axis=1)),
            np.ascontiguousarray(np.stack([r.channel for r in records])))
