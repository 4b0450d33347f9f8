"""Parallelism of the GPT-2 blocks over real ``torch.distributed`` process groups.

* :mod:`~labsupport.parallel.launcher` — :class:`WorkerGroup`: start, use and stop local workers;
* :mod:`~labsupport.parallel.comm` — :class:`Comm`: counted, timed all-reduce / send / recv / all-to-all;
* :mod:`~labsupport.parallel.tensor` — tensor parallelism (Megatron-LM column/row split);
* :mod:`~labsupport.parallel.pipeline` — pipeline parallelism (GPipe micro-batches, the bubble);
* :mod:`~labsupport.parallel.expert` — expert parallelism of a mixture-of-experts MLP (GShard);
* :mod:`~labsupport.parallel.cost_model` — the same volumes on an H100 cluster.
"""

from .comm import Comm, ring_factor
from .launcher import PortInUseError, WorkerError, WorkerGroup, free_port

__all__ = ["Comm", "PortInUseError", "WorkerError", "WorkerGroup", "free_port", "ring_factor"]
