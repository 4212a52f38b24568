"""Methods venusrl adds to each vLLM worker (`worker_extension_cls`), called through
`AsyncLLM.collective_rpc`. Runs inside vLLM's worker processes."""

from __future__ import annotations

import os
import re

import torch
from safetensors.torch import load_file


class VenusWorkerExtension:
    """Mixed into vLLM's worker class: `self` is the worker."""

    def venusrl_load_weights(self, path: str) -> int:
        """Load a trainer's state dict (Hugging Face names, as `save_pretrained` writes them),
        saved as safetensors at `path`, into the running model through vLLM's in-place reload:
        the model's `load_weights` (fusing q/k/v and gate/up as vLLM lays them out), then the
        weights processed again into the kernel layout (the CPU build repacks linear weights
        and empties the checkpoint-shaped parameters, so a plain `load_weights` fails). A file,
        not the tensors: vLLM's RPC to its workers turns tensor arguments into nested lists.
        Returns the number of tensors loaded."""
        state_dict = load_file(path)
        with torch.no_grad():
            self.reload_weights(weights_iterator=iter(state_dict.items()))  # type: ignore[attr-defined]
            self._retie_lm_head()
        return len(state_dict)

    def venusrl_unpin_compute(self) -> list[int]:
        """On the CPU build, NixlConnector pins the thread that creates it, the worker's main
        thread, which also runs the model, to the last core of each NUMA node for its KV
        transfers (`nixl/base_worker.py:702-714`, `os.sched_setaffinity(0, ...)`): on a host
        with one NUMA node every engine's forward pass would share that core. The main thread
        goes back to the cores vLLM bound the worker's OpenMP threads to (the environment it was
        spawned with, `vllm/utils/ompmultiprocessing.py:71-102`); NIXL's own threads stay where
        it put them. Returns those cores (empty: nothing to restore)."""
        cores = _omp_cores(os.environ)
        if cores:
            os.sched_setaffinity(0, cores)
        return cores

    def _retie_lm_head(self) -> None:
        """A tied lm_head loads no weights of its own, so vLLM 0.32's reload puts its old kernel
        tensors back (and warns "ParallelLMHead: Failed to load weights"): it would keep
        the old embedding. Tie it to the new one again and redo its kernel processing."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        hf_config = self.model_runner.model_config.hf_config  # type: ignore[attr-defined]
        lm_head, embed = getattr(model, "lm_head", None), getattr(getattr(model, "model", None), "embed_tokens", None)
        if not getattr(hf_config, "tie_word_embeddings", False) or lm_head is None or embed is None:
            return
        lm_head.weight = embed.weight
        lm_head.quant_method.process_weights_after_loading(lm_head)


def _omp_cores(env) -> list[int]:
    """The cores vLLM's spawn environment binds OpenMP to: OMP_PLACES `{0,1}`, GOMP_CPU_AFFINITY
    `0 1`, or KMP_AFFINITY `...,proclist=[0,1]`."""
    if env.get("KMP_AFFINITY"):
        spec = env["KMP_AFFINITY"].partition("proclist=")[2]
    else:
        spec = env.get("GOMP_CPU_AFFINITY") or env.get("OMP_PLACES", "")
    return sorted({int(core) for core in re.findall(r"\d+", spec)})
