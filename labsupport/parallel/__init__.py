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

from .._faces import lazy_face

_FACE = {                  # what the chapters use: imported on first use (labsupport._faces)
    "Comm": "comm",
    "LOGITS_ATOL": "tensor",
    "PipelineStage": "pipeline",
    "bubble_fraction": "pipeline",
    "bubble_unequal": "pipeline",
    "bubbles_from_results": "pipeline",
    "dispatch_table": "expert",
    "ep_bytes_exact": "expert",
    "expert_owner": "expert",
    "hidden_states_for_moe": "expert",
    "init_moe": "expert",
    "load_imbalance": "expert",
    "measured_bubble": "pipeline",
    "moe_forward": "expert",
    "pp_forward": "pipeline",
    "reference_logits": "tensor",
    "route": "expert",
    "shard_layer": "tensor",
    "summarise_tp": "tensor",
    "tp_block": "tensor",
    "tp_generate": "tensor",
    "weights_from_model": "tensor",
}
__getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
